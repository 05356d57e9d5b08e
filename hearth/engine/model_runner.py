"""Turns a scheduled batch into flat tensors, runs the model, and samples.

Flat batch: decodes first (one token each), then prefill chunks. No sequence is padded to the longest. The
attention metadata (block tables, context lengths, query offsets as int32 tensors) is built once per step with
numpy and shared by every layer.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn

from hearth.engine.block_manager import BlockManager
from hearth.engine.encoder_cache import DEFAULT_CACHE_BYTES, EncoderCache, image_rows
from hearth.engine.input_batch import DecodeBatch, SeqInput, prepare_inputs
from hearth.engine.lora_pool import LoRAPool
from hearth.engine.request import Request
from hearth.engine.scheduler import ScheduledRequest, SchedulerOutput
from hearth.weights import activations
from hearth.layers.attention import Attention
from hearth.layers.sampler import Sampler, SamplerOutput, TokenLogprobs, logprobs_of
from hearth.engine.spec_decode.rejection_sampler import RejectionSampler


@dataclass
class StepResult:
    # Requests that produced tokens this step: one, or (speculative) the accepted draft tokens plus one.
    sampled: list[tuple[Request, list[int], list[TokenLogprobs | None]]]
    prompt_logprobs: dict[str, list[TokenLogprobs | None]]  # request id -> entries for this chunk's positions
    num_accepted: dict[str, int] = field(default_factory=dict)  # speculative request id -> draft tokens accepted


def _new_tokens(s: ScheduledRequest) -> list[int]:
    """The scheduled tokens: known ones from num_computed_tokens on, then the draft tokens (never in all_token_ids)."""
    req = s.request
    start = req.num_computed_tokens
    return req.all_token_ids[start:start + s.num_new_tokens - len(s.spec_token_ids)] + s.spec_token_ids


class ModelRunner:
    def __init__(self, model: nn.Module, num_blocks: int, block_size: int, kv_dtype: torch.dtype,
                 vocab_size: int, seed: int = 0, lora: LoRAPool | None = None,
                 encoder_cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.model = model
        self.lora = lora  # --enable-lora: the adapters, and each step's rows per adapter
        self.block_size = block_size
        self.sampler = Sampler(vocab_size, seed)
        self.rejection_sampler = RejectionSampler(self.sampler)
        self.decode_batch = DecodeBatch(block_size)
        self._last_sampled: torch.Tensor | None = None  # the decode batch's tokens from its last step
        self.attn_layers = [m for m in model.modules() if isinstance(m, Attention)]
        # A model that takes images: their encoder outputs while their prompt rows are prefilled, and after
        self.encoder_cache = (EncoderCache(model.encode_image, encoder_cache_bytes)
                              if getattr(model, "takes_images", False) else None)
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
        scheduled = sched.scheduled
        # Decodes only (one sampled token each, prompt done): the common step with many sequences running.
        if sched.all_decodes and block_manager.sliding_window is None:
            reqs = [s.request for s in scheduled]
            try:
                input_ids, positions, meta = self.decode_batch.prepare(reqs, block_manager.block_table,
                                                                       self._last_sampled)
                # (forward, not __call__: no module hooks are used, and their dispatch is not free with cold caches)
                with self._adapter_rows([(r.lora_id, r.lora_scale, 1) for r in reqs] if self.lora is not None else []):
                    hidden = self.model.forward(input_ids, positions, meta)  # [N, hidden]
                out: SamplerOutput = self.sampler(self.model.compute_logits(hidden), reqs)
            except BaseException:
                self.decode_batch.reset()  # its rows moved on a step that did not happen
                raise
            self._last_sampled = out.token_tensor
            return StepResult([(r, [t], [lp]) for r, t, lp in zip(reqs, out.token_ids, out.logprobs)], {})
        self.decode_batch.reset()
        seqs = [SeqInput(_new_tokens(s), s.request.num_computed_tokens, block_manager.block_table(s.request.request_id))
                for s in scheduled]
        # Generated tokens first (decodes, then speculative verification or a recomputed tail), then prompts (stable):
        # activations.prompt_rows rounds the rows after the generated ones as prompt tokens. (prepare_inputs: decodes lead.)
        generated = [s.request.num_computed_tokens >= s.request.num_prompt_tokens for s in scheduled]
        order = sorted(range(len(seqs)), key=lambda i: (not generated[i], not seqs[i].is_decode))
        ordered = [scheduled[i] for i in order]
        input_ids, positions, meta = prepare_inputs([seqs[i] for i in order], self.block_size)
        gen_rows = sum(s.num_new_tokens for s, g in zip(scheduled, generated) if g)
        # (quantized weights: a prompt's rows get the same numbers however many run)
        images = self._image_rows(ordered)
        with (activations.prompt_rows(gen_rows, int(input_ids.shape[0])),
              self._adapter_rows([(s.request.lora_id, s.request.lora_scale, s.num_new_tokens) for s in ordered])):
            if images is None:
                hidden = self.model(input_ids, positions, meta)  # [T, hidden]
            else:  # (an image's rows take its encoder output in place of the placeholder's embedding)
                hidden = self.model(input_ids, positions, meta, image_rows=images[0], image_embeds=images[1])
        return self._sample(hidden, ordered)

    def _image_rows(self, ordered: list[ScheduledRequest]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(rows, embeddings) of the step's image tokens, in the flat batch's row order; None if there are none."""
        if self.encoder_cache is None or not any(s.request.mm_inputs for s in ordered):
            return None
        return image_rows([(s.request.mm_inputs, s.request.num_computed_tokens, s.num_new_tokens) for s in ordered],
                          self.encoder_cache)

    def _adapter_rows(self, spans: list[tuple[int, float, int]]):
        """The step's rows per adapter for the model's LoRA layers, while the forward pass runs. spans: (adapter
        id, its scale, rows) of each request in row order."""
        if self.lora is None or not any(lora_id for lora_id, _, _ in spans):
            return nullcontext()
        return self.lora.rows.use(self.lora.row_groups(spans))

    def _sample(self, hidden: torch.Tensor, ordered: list[ScheduledRequest]) -> StepResult:
        last_idx, sample_reqs = [], []
        spec_idx: list[int] = []  # rows of speculative requests: every new token's logits are needed
        spec: list[ScheduledRequest] = []
        prompt_lp: dict[str, list[TokenLogprobs | None]] = {}
        offset = 0
        for s in ordered:
            req = s.request
            if req.params.prompt_logprobs is not None and req.num_computed_tokens < req.num_prompt_tokens:
                prompt_lp[req.request_id] = self._prompt_logprobs(hidden[offset:offset + s.num_new_tokens], req,
                                                                  s.num_new_tokens)
            if s.spec_token_ids:
                spec_idx.extend(range(offset, offset + s.num_new_tokens))
                spec.append(s)
            elif s.sample:
                last_idx.append(offset + s.num_new_tokens - 1)
                sample_reqs.append(req)
            offset += s.num_new_tokens
        sampled: list[tuple[Request, list[int], list[TokenLogprobs | None]]] = []
        if sample_reqs:
            logits = self.model.compute_logits(hidden[last_idx])  # [N, V] float32
            out: SamplerOutput = self.sampler(logits, sample_reqs)
            sampled = [(r, [t], [lp]) for r, t, lp in zip(sample_reqs, out.token_ids, out.logprobs)]
        num_accepted: dict[str, int] = {}
        if spec:
            logits = self.model.compute_logits(hidden[spec_idx])  # [sum(1 + k), V]
            results = self.rejection_sampler(logits, [s.request for s in spec], [s.spec_token_ids for s in spec],
                                             [s.draft_probs for s in spec])
            for s, res in zip(spec, results):
                sampled.append((s.request, res.token_ids, res.logprobs))
                num_accepted[s.request.request_id] = res.num_accepted
        return StepResult(sampled, prompt_lp, num_accepted)

    def _prompt_logprobs(self, hidden: torch.Tensor, req: Request, n: int) -> list[TokenLogprobs | None]:
        """Logprobs of prompt tokens predicted within this chunk. Entry j is for prompt token start + j + 1."""
        start = req.num_computed_tokens
        stop = min(start + n, req.num_prompt_tokens - 1)  # positions whose next token is a prompt token
        if stop <= start:
            return []
        logprobs = torch.log_softmax(self.model.compute_logits(hidden[: stop - start]), dim=-1)
        targets = torch.tensor(req.prompt_token_ids[start + 1: stop + 1], dtype=torch.long)
        return logprobs_of(logprobs, targets, req.params.prompt_logprobs)
