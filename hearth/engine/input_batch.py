"""Flat model inputs for one forward pass: input ids, positions and the paged-attention metadata.

Shared by the target's runner and the draft model's proposer (which reads the same block tables).
"""
from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from hearth.engine.request import Request
from hearth.layers.attention import AttentionMetadata, PrefillSeq


@dataclass
class SeqInput:
    token_ids: list[int]  # this step's new tokens
    start: int  # position of the first of them (= this sequence's tokens already in the cache)
    block_table: list[int]

    @property
    def is_decode(self) -> bool:
        return len(self.token_ids) == 1 and self.start > 0


def prepare_inputs(seqs: list[SeqInput], block_size: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """A handful of numpy ops over all sequences, no per-token Python.

    NOTE: decodes must come first (AttentionMetadata's layout): sequences before the first non-decode are decodes.
    """
    n = len(seqs)
    bs = block_size
    num_decodes = next((i for i, s in enumerate(seqs) if not s.is_decode), n)
    q_lens = np.fromiter((len(s.token_ids) for s in seqs), np.int64, n)
    computed = np.fromiter((s.start for s in seqs), np.int64, n)
    query_start = np.zeros(n + 1, np.int64)
    np.cumsum(q_lens, out=query_start[1:])
    num_tokens = int(query_start[-1])
    input_ids = list(itertools.chain.from_iterable(s.token_ids for s in seqs))
    seq_of_token = np.repeat(np.arange(n), q_lens)  # [T]
    positions = np.arange(num_tokens) + (computed - query_start[:-1])[seq_of_token]  # [T]
    block_tables = _block_tables([s.block_table for s in seqs])
    slot_mapping = block_tables[seq_of_token, positions // bs].astype(np.int64) * bs + positions % bs
    context_lens = computed + q_lens
    prefills = [PrefillSeq(int(query_start[i]), int(q_lens[i]), int(context_lens[i]), i)
                for i in range(num_decodes, n)]
    meta = AttentionMetadata(
        slot_mapping=torch.from_numpy(slot_mapping), query_start_loc=torch.from_numpy(query_start.astype(np.int32)),
        context_lens=torch.from_numpy(context_lens.astype(np.int32)), block_tables=torch.from_numpy(block_tables),
        num_decode_tokens=num_decodes, prefills=prefills)
    return torch.tensor(input_ids, dtype=torch.long), torch.from_numpy(positions), meta


class DecodeBatch:
    """A decode-only step's inputs kept across steps (vLLM v1's persistent batch, cut down to decodes).

    When a step decodes the same requests, in the same order, as the decode step just before it, nothing is
    rebuilt: positions, slots and context lengths move on by one in place, the input tokens are the tokens that
    step sampled, and a block-table entry is written only for the rows that start a new block this step (known
    since the rebuild: a row starts one every block_size steps). Any other step (a request joined, finished or was
    preempted; a prefill or speculative step ran in between: the runner calls reset) rebuilds the rows from the
    requests.

    Why: right after a forward pass has streamed the weights through the caches, every numpy or torch call pays
    cache misses many times its warm cost, so the steady state makes two numpy calls and touches no per-request
    object.

    NOTE: the tensors handed out are views of arrays updated in place the next step: valid for one step.
    NOTE: block-table rows keep entries past a row's context (padding is 0 after a rebuild, stale after rows are
    reused); readers stop at context_lens. Not used with a sliding window, whose released blocks change old
    entries of a table.
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.reqs: list[Request] = []  # the rows of the last step built here; [] = rebuild next time
        self._alloc(8, 8)

    def _alloc(self, rows: int, cols: int) -> None:
        self.pos_slots = np.zeros((2, rows), np.int64)  # [0]: positions, [1]: slots (one in-place add for both)
        self.context_lens = np.zeros(rows, np.int32)
        self.block_tables = np.zeros((rows, cols), np.int32)
        self.query_start = torch.arange(rows + 1, dtype=torch.int32)
        self.reqs = []

    def reset(self) -> None:
        self.reqs = []

    def prepare(self, reqs: list[Request], tables: Callable[[str], list[int]], sampled: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """reqs: decodes only (one new token at position num_computed_tokens > 0 each). tables: request id -> its
        block table. sampled: the tokens the previous step sampled for the same rows (None: read the requests)."""
        if reqs == self.reqs and sampled is not None:
            self._bump += 1  # positions and slots
            self._ctx += 1
            self._tick += 1
            bs = self.block_size
            for i in self._new_block_rows[self._tick % bs]:
                col = int(self.pos_slots[0, i]) // bs
                if col >= self.block_tables.shape[1]:
                    self._widen(2 * col)
                block = tables(reqs[i].request_id)[col]
                self.block_tables[i, col] = block
                self.pos_slots[1, i] = block * bs
            input_ids = sampled
        else:
            self._rebuild(reqs, tables)
            input_ids = torch.tensor([r.all_token_ids[r.num_computed_tokens] for r in reqs], dtype=torch.long)
        slots, ctx, table, pos, query_start = self._views
        meta = AttentionMetadata(slot_mapping=slots, query_start_loc=query_start, context_lens=ctx,
                                 block_tables=table, num_decode_tokens=len(reqs), prefills=[])
        return input_ids, pos, meta

    def _widen(self, cols: int) -> None:
        table = np.zeros((self.block_tables.shape[0], cols), np.int32)
        table[:, : self.block_tables.shape[1]] = self.block_tables
        self.block_tables = table
        v = self._views
        self._views = v[:2] + (torch.from_numpy(table[: len(self.reqs)]),) + v[3:]

    def _rebuild(self, reqs: list[Request], tables: Callable[[str], list[int]]) -> None:
        n, bs = len(reqs), self.block_size
        rows = [tables(r.request_id) for r in reqs]
        width = max(map(len, rows))
        if n > self.context_lens.shape[0] or width > self.block_tables.shape[1]:
            self._alloc(max(n, 2 * self.context_lens.shape[0]), max(width, 2 * self.block_tables.shape[1]))
        starts = [r.num_computed_tokens for r in reqs]
        pos, slots = self.pos_slots[0, :n], self.pos_slots[1, :n]
        pos[:] = starts
        self.context_lens[:n] = pos + 1
        self.block_tables[:n] = 0
        self.block_tables[:n, :width] = _block_tables(rows)
        slots[:] = self.block_tables[np.arange(n), pos // bs].astype(np.int64) * bs + pos % bs
        # Row i starts a block at each step t (counted from this one) with (starts[i] + t) % bs == 0.
        self._new_block_rows: list[list[int]] = [[] for _ in range(bs)]
        for i, p in enumerate(starts):
            self._new_block_rows[-p % bs].append(i)
        self._tick = 0
        self._bump, self._ctx = self.pos_slots[:, :n], self.context_lens[:n]
        self._views = (torch.from_numpy(slots), torch.from_numpy(self._ctx), torch.from_numpy(self.block_tables[:n]),
                       torch.from_numpy(pos), self.query_start[: n + 1])
        self.reqs = list(reqs)


def _block_tables(tables: list[list[int]]) -> np.ndarray:
    """[S, max_blocks] int32, each row a sequence's blocks padded with block 0."""
    n = len(tables)
    n_blocks = np.fromiter(map(len, tables), np.int64, n)
    out = np.zeros((n, int(n_blocks.max())), np.int32)
    out[np.arange(out.shape[1]) < n_blocks[:, None]] = np.fromiter(
        itertools.chain.from_iterable(tables), np.int32, int(n_blocks.sum()))
    return out
