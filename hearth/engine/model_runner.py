"""Turns a scheduled batch into flat tensors, runs the model, and samples.

Flat batch: decodes first (one token each), then prefill chunks. No sequence is padded to the longest;
only the batched decode attention pads its context gather (masked).
"""
from __future__ import annotations

from dataclasses import dataclass

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
            # KV actually used. Only block 0 is zeroed: padded decode gathers read slot 0 (masked, but a NaN
            # bit pattern there would still poison softmax(-inf) * V).
            kv = (torch.empty(shape, dtype=kv_dtype), torch.empty(shape, dtype=kv_dtype))
            kv[0][0].zero_()
            kv[1][0].zero_()
            layer.kv_cache = kv
            self.kv_caches.append(kv)

    @staticmethod
    def kv_bytes_per_block(model: nn.Module, block_size: int, kv_dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=kv_dtype).element_size()
        return sum(2 * block_size * m.num_kv_heads * m.head_dim * elem
                   for m in model.modules() if isinstance(m, Attention))

    def _slots(self, table: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        bs = self.block_size
        return table[positions // bs] * bs + positions % bs

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput, block_manager: BlockManager) -> StepResult:
        decodes = [s for s in sched.scheduled if s.num_new_tokens == 1 and s.request.num_computed_tokens > 0]
        prefills = [s for s in sched.scheduled if not (s.num_new_tokens == 1 and s.request.num_computed_tokens > 0)]
        ordered = decodes + prefills
        input_ids: list[int] = []
        positions: list[int] = []
        tables = [torch.tensor(block_manager.block_table(s.request.request_id), dtype=torch.long) for s in ordered]
        for s in ordered:
            start = s.request.num_computed_tokens
            input_ids.extend(s.request.all_token_ids[start:start + s.num_new_tokens])
            positions.extend(range(start, start + s.num_new_tokens))
        pos_t = torch.tensor(positions, dtype=torch.long)
        slot_parts = []
        offset = 0
        for s, table in zip(ordered, tables):
            slot_parts.append(self._slots(table, pos_t[offset:offset + s.num_new_tokens]))
            offset += s.num_new_tokens
        meta = AttentionMetadata(
            slot_mapping=torch.cat(slot_parts), num_decode_tokens=len(decodes),
            decode_slots=None, decode_mask=None, decode_positions=None, prefills=[])
        if decodes:
            self._decode_meta(meta, decodes, tables[: len(decodes)])
        offset = len(decodes)
        for s, table in zip(prefills, tables[len(decodes):]):
            ctx = s.request.num_computed_tokens + s.num_new_tokens
            meta.prefills.append(PrefillSeq(offset, s.num_new_tokens, ctx, self._slots(table, torch.arange(ctx))))
            offset += s.num_new_tokens

        hidden = self.model(torch.tensor(input_ids, dtype=torch.long), pos_t, meta)  # [T, hidden]
        return self._sample(hidden, ordered)

    def _decode_meta(self, meta: AttentionMetadata, decodes: list[ScheduledRequest],
                     tables: list[torch.Tensor]) -> None:
        ctx = torch.tensor([s.request.num_computed_tokens + 1 for s in decodes])
        max_ctx = int(ctx.max())
        width = max(len(t) for t in tables)
        table = torch.zeros(len(decodes), width, dtype=torch.long)
        for i, t in enumerate(tables):
            table[i, : len(t)] = t
        pos = torch.arange(max_ctx)
        bs = self.block_size
        slots = table[:, pos // bs] * bs + pos % bs  # [B, max_ctx]
        pad = pos.unsqueeze(0) >= ctx.unsqueeze(1)
        meta.decode_slots = slots.masked_fill(pad, 0)
        meta.decode_mask = torch.zeros(pad.shape).masked_fill_(pad, float("-inf"))[:, None, None, :]
        meta.decode_positions = ctx - 1

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
