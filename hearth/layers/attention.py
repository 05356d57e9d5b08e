"""Paged attention over a block-structured KV cache.

Cache layout per layer: k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]. A token's slot is
block_id * block_size + offset. Each layer first writes the step's new K/V into their slots, then attends, so
a request may read KV another request writes in the same step (prefix-cache hits within a step rely on it).

Attention runs on hearth's C++ kernel (hearth.kernels.attention), which reads each sequence's K/V where they lie
through its block table: decodes, chunked-prefill chunks and prefix-cache hits in one parallel call per layer.
On AVX2 kernels, fresh prompts of at least SDPA_MIN_PROMPT tokens go to torch's SDPA instead, on this
step's own k/v, which are exactly their context. Without the kernel (no compiler, unsupported CPU or head size,
HEARTH_KERNELS=0) a torch path gathers each context from the cache.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from hearth import kernels
from hearth.kernels import attention as attn_kernel
from hearth.kernels import fused
from hearth.kernels.decoder import AttentionSpec

# Fresh prompts (no cached context) at least this long use SDPA rather than the kernel when the layer allows it
# (no softcap or ALiBi; window absent or not shorter than the prompt). None: the default for this CPU's kernels.
# AVX2: the kernel is ahead on short prompts, SDPA's blocked GEMMs on long ones (the crossover is between 512 and
# 1024 tokens). AVX-512 (the tiled path): the kernel is ahead at every length measured, so no threshold.
SDPA_MIN_PROMPT: int | None = None
_SDPA_MIN_PROMPT_AVX2 = 768


def sdpa_min_prompt() -> int | None:
    if SDPA_MIN_PROMPT is not None:
        return SDPA_MIN_PROMPT
    return _SDPA_MIN_PROMPT_AVX2 if kernels.isa() == kernels.ISA_AVX2 else None


@dataclass
class PrefillSeq:
    """One sequence with more than one new token, or with no context in cache before this step."""

    query_start: int  # offset of its first new token in the flat batch
    query_len: int
    context_len: int  # tokens in cache after this step, new ones included
    seq_index: int  # its row in AttentionMetadata's per-sequence tensors


@dataclass
class AttentionMetadata:
    """Built once per step by the model runner; shared by every layer. Sequences are in flat-batch order,
    decodes (one new token each) first: sequence i < num_decode_tokens owns flat token i."""

    slot_mapping: torch.Tensor  # [num_tokens] int64: where each new token's K/V goes
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32: flat offset of each sequence's new tokens
    context_lens: torch.Tensor  # [num_seqs] int32: tokens in cache after this step, new ones included
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, padded with 0
    num_decode_tokens: int
    prefills: list[PrefillSeq]
    # Per-layer-kind work split, computed on first use in a step: (window, kernel only?) -> (kernel seq ids or None for
    # all, SDPA prefills). Also the torch path's gathered slots under "torch".
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def num_seqs(self) -> int:
        return self.context_lens.shape[0]

    def split(self, sliding_window: int | None, kernel_only: bool) -> tuple[torch.Tensor | None, list[PrefillSeq]]:
        """kernel_only: the layer needs what SDPA's fused path lacks (softcap, ALiBi): no prompt goes to SDPA."""
        key = (sliding_window, kernel_only)
        if key not in self._cache:
            threshold = sdpa_min_prompt()
            sdpa = [] if kernel_only or threshold is None else [
                p for p in self.prefills
                if p.query_len == p.context_len and p.query_len >= threshold
                and (not sliding_window or p.query_len <= sliding_window)]
            ids = None
            if sdpa:
                skip = {p.seq_index for p in sdpa}
                ids = torch.tensor([i for i in range(self.num_seqs) if i not in skip], dtype=torch.int32)
            self._cache[key] = (ids, sdpa)
        return self._cache[key]


class Attention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 sliding_window: int | None = None, logit_softcap: float | None = None,
                 alibi_slopes: list[float] | None = None) -> None:
        """alibi_slopes: one per query head; adds slope * (key_pos - query_pos) to the scaled scores (ALiBi)."""
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.sliding_window = sliding_window
        self.logit_softcap = logit_softcap
        # NOTE: a plain attribute, not a buffer: not a checkpoint tensor, always fp32 (the kernel reads it as such).
        self.alibi_slopes = (torch.tensor(alibi_slopes, dtype=torch.float32) if alibi_slopes is not None else None)
        self.kv_cache: tuple[torch.Tensor, torch.Tensor] | None = None  # bound by the model runner
        # int8 caches only: per-token, per-head fp32 scales [num_blocks, block_size, Hkv] (x = int8 * scale)
        self.kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None
        self._kernel: tuple[int, bool] | None = None  # (id of the bound cache, kernel supports it)

    def program_spec(self) -> AttentionSpec | None:
        """This attention as the decode program runs it (None: ALiBi, no bound cache, or a cache or head size the
        kernel does not take)."""
        if self.alibi_slopes is not None or self.kv_cache is None:
            return None
        k_cache, v_cache = self.kv_cache
        isa = attn_kernel.isa_for(self.head_dim)
        if isa is None or not attn_kernel.supports(k_cache, self.head_dim):
            return None
        return AttentionSpec(self.num_heads, self.num_kv_heads, self.head_dim, self.scale, self.sliding_window or 0,
                             self.logit_softcap or 0.0, k_cache, v_cache, isa)

    def use_kernel(self) -> bool:
        k_cache = self.kv_cache[0]
        if self._kernel is None or self._kernel[0] != id(k_cache):
            self._kernel = (id(k_cache), attn_kernel.supports(k_cache, self.head_dim))
        return self._kernel[1]

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """q: [T, H, D], k/v: [T, Hkv, D] -> [T, H * D]."""
        assert self.kv_cache is not None, "KV cache not bound: the model runner binds it before the first step"
        k_cache, v_cache = self.kv_cache
        k_flat = k_cache.view(-1, self.num_kv_heads, self.head_dim)
        v_flat = v_cache.view(-1, self.num_kv_heads, self.head_dim)
        scales = None
        if k_cache.dtype == torch.int8:
            # NOTE: each token's K/V row is quantized on its own, so blocks filled over several steps, chunked
            # prefill and prefix-cache sharing never requantize anything already in the cache.
            scales = tuple(sc.view(-1, self.num_kv_heads) for sc in self.kv_scales)
            (kq, ks), (vq, vs) = attn_kernel.quantize_int8(k), attn_kernel.quantize_int8(v)
            k_flat.index_copy_(0, meta.slot_mapping, kq)
            v_flat.index_copy_(0, meta.slot_mapping, vq)
            scales[0].index_copy_(0, meta.slot_mapping, ks)
            scales[1].index_copy_(0, meta.slot_mapping, vs)
        elif not fused.kv_write(k, v, k_flat, v_flat, meta.slot_mapping):  # one C call; else two index_copy_
            k_flat.index_copy_(0, meta.slot_mapping, k.to(k_flat.dtype))
            v_flat.index_copy_(0, meta.slot_mapping, v.to(v_flat.dtype))
        if not self.use_kernel():
            return self._forward_torch(q, _Rows(k_flat, scales and scales[0], q.dtype),
                                       _Rows(v_flat, scales and scales[1], q.dtype), meta, k_cache.shape[1])

        num_tokens = q.shape[0]
        q32 = q.float()
        if q32.stride(2) != 1 or q32.stride(1) != self.head_dim:
            q32 = q32.contiguous()
        out = torch.empty(num_tokens, self.num_heads, self.head_dim, dtype=torch.float32)  # [T, H, D]
        # NOTE: ALiBi prompts stay on the kernel: SDPA would need an [H, Q, Q] bias tensor materialized.
        seq_ids, sdpa = meta.split(self.sliding_window, bool(self.logit_softcap) or self.alibi_slopes is not None)
        if seq_ids is None or seq_ids.numel():
            attn_kernel.paged_attention(q32, k_cache, v_cache, meta.block_tables, meta.query_start_loc,
                                        meta.context_lens, out, self.scale, seq_ids=seq_ids,
                                        sliding_window=self.sliding_window, logit_softcap=self.logit_softcap,
                                        k_scale=self.kv_scales[0] if scales else None,
                                        v_scale=self.kv_scales[1] if scales else None,
                                        alibi_slopes=self.alibi_slopes, q_is_bf16=q.dtype == torch.bfloat16)
        for p in sdpa:
            # NOTE: a fresh prompt's context is exactly this step's k/v for its tokens: no cache read needed.
            s = slice(p.query_start, p.query_start + p.query_len)
            out[s] = self._causal_sdpa(q[s], k[s], v[s])
        return out.view(num_tokens, -1).to(q.dtype)

    def _causal_sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [Q, H, D], k/v [Q, Hkv, D] of one fresh prompt -> [Q, H, D]."""
        o = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
                                           v.transpose(0, 1).unsqueeze(0), is_causal=True, scale=self.scale,
                                           enable_gqa=True)
        return o.squeeze(0).transpose(0, 1)

    # ---- torch path: gathers each sequence's context from the cache (used only without the kernel) ----

    def _forward_torch(self, q: torch.Tensor, k_flat: _Rows, v_flat: _Rows,
                       meta: AttentionMetadata, block_size: int) -> torch.Tensor:
        out = torch.empty_like(q)
        nd = meta.num_decode_tokens
        gathered = _torch_slots(meta, block_size)
        if nd:
            out[:nd] = self._decode(q[:nd], k_flat, v_flat, *gathered[0])
        for p, slot_ids in zip(meta.prefills, gathered[1]):
            s = slice(p.query_start, p.query_start + p.query_len)
            out[s] = self._prefill(q[s], k_flat[slot_ids], v_flat[slot_ids], p)
        return out.view(q.shape[0], -1)

    def _softcap(self, scores: torch.Tensor) -> torch.Tensor:
        # NOTE: before masking: tanh would turn a masked -inf into -cap, which softmax does not ignore.
        if self.logit_softcap:
            scores = torch.tanh(scores / self.logit_softcap) * self.logit_softcap
        return scores

    def _scores_to_out(self, scores: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v)

    def _decode(self, q: torch.Tensor, k_flat: _Rows, v_flat: _Rows, slots: torch.Tensor,
                mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        b = q.shape[0]
        g = self.num_heads // self.num_kv_heads
        keys = k_flat[slots].permute(0, 2, 3, 1)  # [B, Hkv, D, L]
        values = v_flat[slots].transpose(1, 2)  # [B, Hkv, L, D]
        qg = q.view(b, self.num_kv_heads, g, self.head_dim)  # [B, Hkv, G, D]
        scores = self._softcap(torch.matmul(qg, keys).float() * self.scale)  # [B, Hkv, G, L]
        if self.alibi_slopes is not None:
            rel = torch.arange(slots.shape[1]).unsqueeze(0) - positions.unsqueeze(1)  # [B, L] key - query position
            scores = scores + self.alibi_slopes.view(1, self.num_kv_heads, g, 1) * rel[:, None, None, :]
        if self.sliding_window:
            key_pos = torch.arange(slots.shape[1]).unsqueeze(0)  # [1, L]
            too_old = key_pos <= (positions.unsqueeze(1) - self.sliding_window)
            mask = mask.masked_fill(too_old[:, None, None, :], float("-inf"))
        scores = scores + mask
        out = self._scores_to_out(scores, values.float() if scores.dtype != values.dtype else values)
        return out.reshape(b, self.num_heads, self.head_dim).to(q.dtype)

    def _prefill(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, p: PrefillSeq) -> torch.Tensor:
        # q: [Q, H, D]; keys/values: [C, Hkv, D]; query i sits at position C - Q + i.
        qh = q.transpose(0, 1).unsqueeze(0)  # [1, H, Q, D]
        kh = keys.transpose(0, 1).unsqueeze(0)  # [1, Hkv, C, D]
        vh = values.transpose(0, 1).unsqueeze(0)
        plain = self.logit_softcap is None and self.alibi_slopes is None
        if plain and self.sliding_window is None and p.query_len == p.context_len:
            o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=self.scale, enable_gqa=True)
        else:
            mask = self._prefill_mask(p)
            if plain:
                o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=self.scale, enable_gqa=True)
            else:  # fp32 scores: the softcap and the ALiBi bias (up to slope * context) want the precision
                g = self.num_heads // self.num_kv_heads
                kh, vh = kh.repeat_interleave(g, dim=1), vh.repeat_interleave(g, dim=1)
                scores = self._softcap(torch.matmul(qh, kh.transpose(-1, -2)).float() * self.scale)
                if self.alibi_slopes is not None:
                    rel = torch.arange(p.context_len) - torch.arange(p.context_len - p.query_len, p.context_len
                                                                     ).unsqueeze(1)  # [Q, C] key - query position
                    scores = scores + self.alibi_slopes.view(1, -1, 1, 1) * rel
                scores = scores.masked_fill(~mask, float("-inf"))
                o = self._scores_to_out(scores, vh.float()).to(q.dtype)
        return o.squeeze(0).transpose(0, 1)  # [Q, H, D]

    def _prefill_mask(self, p: PrefillSeq) -> torch.Tensor:
        q_pos = torch.arange(p.context_len - p.query_len, p.context_len).unsqueeze(1)  # [Q, 1]
        k_pos = torch.arange(p.context_len).unsqueeze(0)  # [1, C]
        mask = k_pos <= q_pos
        if self.sliding_window:
            mask &= k_pos > q_pos - self.sliding_window
        return mask  # [Q, C] bool, True = attend


def alibi_slopes(num_heads: int) -> list[float]:
    """ALiBi's per-head slopes (Press et al.; Baichuan-13B's _get_interleave, vLLM's _get_alibi_slopes): a geometric
    sequence from 2^(-8/n) for a power-of-2 n; otherwise the slopes of the closest smaller power of 2, then every
    other slope of the next larger one."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = 2.0 ** (-(2.0 ** -(math.log2(closest) - 3)))
    slopes = [base ** i for i in range(1, closest + 1)]
    if closest != num_heads:
        extra = 2.0 ** (-(2.0 ** -(math.log2(2 * closest) - 3)))
        slopes += [extra ** i for i in range(1, 1 + 2 * (num_heads - closest), 2)]
    return slopes


class _Rows:
    """Cache rows [num_slots, Hkv, D] indexed by slot; int8 rows come out dequantized in the model's dtype."""

    def __init__(self, flat: torch.Tensor, scales: torch.Tensor | None, dtype: torch.dtype) -> None:
        self.flat, self.scales, self.dtype = flat, scales, dtype

    def __getitem__(self, idx: torch.Tensor) -> torch.Tensor:
        if self.scales is None:
            return self.flat[idx]
        return (self.flat[idx].float() * self.scales[idx].unsqueeze(-1)).to(self.dtype)


def _torch_slots(meta: AttentionMetadata, block_size: int):
    """Slots of every context for the torch path, computed once per step: ((decode slots [B, max_ctx] padded
    with slot 0, additive mask [B, 1, 1, max_ctx], positions [B]), [slot ids [C] per prefill])."""
    if "torch" not in meta._cache:
        bs = block_size
        tables = meta.block_tables.long()
        ctx = meta.context_lens.long()
        nd = meta.num_decode_tokens
        decode = (None, None, None)
        if nd:
            dctx = ctx[:nd]
            pos = torch.arange(int(dctx.max()))
            slots = tables[:nd, pos // bs] * bs + pos % bs  # [B, max_ctx]
            pad = pos.unsqueeze(0) >= dctx.unsqueeze(1)
            # NOTE: padding reads slot 0 (masked); the runner zeroes block 0 so no NaN bit pattern leaks in. Blocks
            # released by the sliding window are block 0 in the tables too: their positions are outside every
            # layer's window, so the window mask hides them here and in _prefill_mask.
            mask = torch.zeros(pad.shape).masked_fill_(pad, float("-inf"))[:, None, None, :]
            decode = (slots.masked_fill(pad, 0), mask, dctx - 1)
        prefill_slots = []
        for p in meta.prefills:
            pos = torch.arange(p.context_len)
            prefill_slots.append(tables[p.seq_index, pos // bs] * bs + pos % bs)
        meta._cache["torch"] = (decode, prefill_slots)
    return meta._cache["torch"]
