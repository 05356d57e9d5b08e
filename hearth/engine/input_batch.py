"""Flat model inputs for one forward pass: input ids, positions and the paged-attention metadata.

Shared by the target's runner and the draft model's proposer (which reads the same block tables).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

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


def prepare_decode_inputs(token_ids: list[int], starts: list[int], tables: list[list[int]],
                          block_size: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """prepare_inputs for a batch of decodes only (one new token each, at position starts[i] > 0): the same
    tensors from fewer numpy ops (the common step with many sequences running)."""
    n = len(token_ids)
    positions = np.array(starts, np.int64)
    block_tables = _block_tables(tables)
    slot_mapping = (block_tables[np.arange(n), positions // block_size].astype(np.int64) * block_size
                    + positions % block_size)
    meta = AttentionMetadata(
        slot_mapping=torch.from_numpy(slot_mapping), query_start_loc=torch.arange(n + 1, dtype=torch.int32),
        context_lens=torch.from_numpy((positions + 1).astype(np.int32)), block_tables=torch.from_numpy(block_tables),
        num_decode_tokens=n, prefills=[])
    return torch.tensor(token_ids, dtype=torch.long), torch.from_numpy(positions), meta


def _block_tables(tables: list[list[int]]) -> np.ndarray:
    """[S, max_blocks] int32, each row a sequence's blocks padded with block 0."""
    n = len(tables)
    n_blocks = np.fromiter(map(len, tables), np.int64, n)
    out = np.zeros((n, int(n_blocks.max())), np.int32)
    out[np.arange(out.shape[1]) < n_blocks[:, None]] = np.fromiter(
        itertools.chain.from_iterable(tables), np.int32, int(n_blocks.sum()))
    return out
