"""Turns a scheduled batch into flat tensors, runs the model, and samples.

Flat batch: decodes first (one token each), then prefill chunks. No sequence is padded to the longest. The
attention metadata (block tables, context lengths, query offsets as int32 tensors) is built once per step with
numpy and shared by every layer.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from hearth.engine.block_manager import BlockManager
from hearth.engine.request import Request
from hearth.engine.scheduler import ScheduledRequest, SchedulerOutput
from hearth.layers.attention import Attention, AttentionMetadata, PrefillSeq
from hearth.layers.sampler import Sampler, SamplerOutput, TokenLogprobs, logprobs_of


@dataclass
class StepResult:
    sampled: list[tuple[Request, int, TokenLogprobs | None]]  # requests that produced a token this step
    prompt_logprobs: dict[str, list[TokenLogprobs | None]]  # request id -> entries for this chunk's positions


class ModelRunner:
    def __init__(self, model: nn.Module, num_blocks: int, block_size: int, kv_dtype: torch.dtype,
                 vocab_size: int, seed: int = 0) -> None:
        self.model = model
        self.block_size = block_size
        self.sampler = Sampler(vocab_size, seed)
        self.attn_layers = [m for m in model.modules() if isinstance(m, Attention)]
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        for layer in self.attn_layers:
            shape = (num_blocks, block_size, layer.num_kv_heads, layer.head_dim)
            # NOTE: empty, not zeros: pages are committed only when a block is first written, so RSS tracks the
            # KV actually used. Only block 0 is zeroed: the torch attention path's padded decode gathers read slot 0
            # (masked, but a NaN bit pattern there would still poison softmax(-inf) * V). The kernel never reads
            # past a context.
            kv = (torch.empty(shape, dtype=kv_dtype), torch.empty(shape, dtype=kv_dtype))
            kv[0][0].zero_()
            kv[1][0].zero_()
            layer.kv_cache = kv
            if kv_dtype == torch.int8:  # int8 KV: one fp32 scale per (slot, kv head), see Attention.forward
                layer.kv_scales = (torch.zeros(shape[:3]), torch.zeros(shape[:3]))
            self.kv_caches.append(kv)

    @staticmethod
    def kv_bytes_per_block(model: nn.Module, block_size: int, kv_dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=kv_dtype).element_size()
        scale = 4 if kv_dtype == torch.int8 else 0  # an fp32 scale per token and kv head
        return sum(2 * block_size * m.num_kv_heads * (m.head_dim * elem + scale)
                   for m in model.modules() if isinstance(m, Attention))

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput, block_manager: BlockManager) -> StepResult:
        decodes = [s for s in sched.scheduled if s.num_new_tokens == 1 and s.request.num_computed_tokens > 0]
        prefills = [s for s in sched.scheduled if not (s.num_new_tokens == 1 and s.request.num_computed_tokens > 0)]
        ordered = decodes + prefills
        input_ids, positions, meta = self._prepare(ordered, len(decodes), block_manager)
        hidden = self.model(input_ids, positions, meta)  # [T, hidden]
        return self._sample(hidden, ordered)

    def _prepare(self, ordered: list[ScheduledRequest], num_decodes: int,
                 block_manager: BlockManager) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Flat input ids, positions and attention metadata: a handful of numpy ops over all sequences, no
        per-token Python."""
        n = len(ordered)
        bs = self.block_size
        q_lens = np.fromiter((s.num_new_tokens for s in ordered), np.int64, n)
        computed = np.fromiter((s.request.num_computed_tokens for s in ordered), np.int64, n)
        query_start = np.zeros(n + 1, np.int64)
        np.cumsum(q_lens, out=query_start[1:])
        num_tokens = int(query_start[-1])
        input_ids: list[int] = []
        for s, start in zip(ordered, computed.tolist()):
            input_ids.extend(s.request.all_token_ids[start:start + s.num_new_tokens])
        seq_of_token = np.repeat(np.arange(n), q_lens)  # [T]
        positions = np.arange(num_tokens) + (computed - query_start[:-1])[seq_of_token]  # [T]
        tables = [block_manager.block_table(s.request.request_id) for s in ordered]
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

    def _sample(self, hidden: torch.Tensor, ordered: list[ScheduledRequest]) -> StepResult:
        last_idx, sample_reqs = [], []
        prompt_lp: dict[str, list[TokenLogprobs | None]] = {}
        offset = 0
        for s in ordered:
            req = s.request
            if req.params.prompt_logprobs is not None and req.num_computed_tokens < req.num_prompt_tokens:
                prompt_lp[req.request_id] = self._prompt_logprobs(hidden[offset:offset + s.num_new_tokens], req,
                                                                  s.num_new_tokens)
            offset += s.num_new_tokens
            if s.sample:
                last_idx.append(offset - 1)
                sample_reqs.append(req)
        sampled: list[tuple[Request, int, TokenLogprobs | None]] = []
        if sample_reqs:
            logits = self.model.compute_logits(hidden[last_idx])  # [N, V] float32
            out: SamplerOutput = self.sampler(logits, sample_reqs)
            sampled = list(zip(sample_reqs, out.token_ids, out.logprobs))
        return StepResult(sampled, prompt_lp)

    def _prompt_logprobs(self, hidden: torch.Tensor, req: Request, n: int) -> list[TokenLogprobs | None]:
        """Logprobs of prompt tokens predicted within this chunk. Entry j is for prompt token start + j + 1."""
        start = req.num_computed_tokens
        stop = min(start + n, req.num_prompt_tokens - 1)  # positions whose next token is a prompt token
        if stop <= start:
            return []
        logprobs = torch.log_softmax(self.model.compute_logits(hidden[: stop - start]), dim=-1)
        targets = torch.tensor(req.prompt_token_ids[start + 1: stop + 1], dtype=torch.long)
        return logprobs_of(logprobs, targets, req.params.prompt_logprobs)
