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
    tables = [s.block_table for s in seqs]
    n_blocks = np.fromiter(map(len, tables), np.int64, n)
    block_tables = np.zeros((n, int(n_blocks.max())), np.int32)  # [S, max_blocks], padded with block 0
    block_tables[np.arange(block_tables.shape[1]) < n_blocks[:, None]] = np.fromiter(
        itertools.chain.from_iterable(tables), np.int32, int(n_blocks.sum()))
    slot_mapping = block_tables[seq_of_token, positions // bs].astype(np.int64) * bs + positions % bs
    context_lens = computed + q_lens
    prefills = [PrefillSeq(int(query_start[i]), int(q_lens[i]), int(context_lens[i]), i)
                for i in range(num_decodes, n)]
    meta = AttentionMetadata(
        slot_mapping=torch.from_numpy(slot_mapping), query_start_loc=torch.from_numpy(query_start.astype(np.int32)),
        context_lens=torch.from_numpy(context_lens.astype(np.int32)), block_tables=torch.from_numpy(block_tables),
        num_decode_tokens=num_decodes, prefills=prefills)
    return torch.tensor(input_ids, dtype=torch.long), torch.from_numpy(positions), meta
