"""Paged attention over a block-structured KV cache.

Cache layout per layer: k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]. A token's slot is
block_id * block_size + offset. Each layer first writes the step's new K/V into their slots, then attends, so
a request may read KV another request writes in the same step (prefix-cache hits within a step rely on it).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class PrefillSeq:
    """One sequence with more than one new token (or whose context needs a full causal mask)."""

    query_start: int  # offset of its first new token in the flat batch
    query_len: int
    context_len: int  # tokens in cache after this step, new ones included
    slot_ids: torch.Tensor  # [context_len] slots of its whole context, in order


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] where each new token's K/V goes
    # Decodes (one new token each) come first in the flat batch and are attended in one batched call.
    num_decode_tokens: int
    decode_slots: torch.Tensor | None  # [num_decodes, max_context] slots of each context (padded with 0)
    decode_mask: torch.Tensor | None  # [num_decodes, 1, 1, max_context] additive: 0 or -inf at padding
    decode_positions: torch.Tensor | None  # [num_decodes] position of each decode token (for sliding windows)
    prefills: list[PrefillSeq]


class Attention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 sliding_window: int | None = None, logit_softcap: float | None = None) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.sliding_window = sliding_window
        self.logit_softcap = logit_softcap
        self.kv_cache: tuple[torch.Tensor, torch.Tensor] | None = None  # bound by the model runner

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """q: [T, H, D], k/v: [T, Hkv, D] -> [T, H * D]."""
        assert self.kv_cache is not None, "KV cache not bound: the model runner binds it before the first step"
        k_cache, v_cache = self.kv_cache
        k_flat = k_cache.view(-1, self.num_kv_heads, self.head_dim)
        v_flat = v_cache.view(-1, self.num_kv_heads, self.head_dim)
        k_flat.index_copy_(0, meta.slot_mapping, k.to(k_flat.dtype))
        v_flat.index_copy_(0, meta.slot_mapping, v.to(v_flat.dtype))

        out = torch.empty_like(q)
        nd = meta.num_decode_tokens
        if nd:
            out[:nd] = self._decode(q[:nd], k_flat, v_flat, meta)
        for p in meta.prefills:
            s = slice(p.query_start, p.query_start + p.query_len)
            out[s] = self._prefill(q[s], k_flat[p.slot_ids], v_flat[p.slot_ids], p)
        return out.view(q.shape[0], -1)

    def _scores_to_out(self, scores: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.logit_softcap:
            scores = torch.tanh(scores / self.logit_softcap) * self.logit_softcap
        return torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v)

    def _decode(self, q: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        b = q.shape[0]
        g = self.num_heads // self.num_kv_heads
        keys = k_flat[meta.decode_slots].permute(0, 2, 3, 1)  # [B, Hkv, D, L]
        values = v_flat[meta.decode_slots].transpose(1, 2)  # [B, Hkv, L, D]
        qg = q.view(b, self.num_kv_heads, g, self.head_dim)  # [B, Hkv, G, D]
        scores = torch.matmul(qg, keys).float() * self.scale  # [B, Hkv, G, L]
        mask = meta.decode_mask
        if self.sliding_window:
            mask = mask + self._decode_window_mask(meta)
        scores = scores + mask
        out = self._scores_to_out(scores, values.float() if scores.dtype != values.dtype else values)
        return out.reshape(b, self.num_heads, self.head_dim).to(q.dtype)

    def _decode_window_mask(self, meta: AttentionMetadata) -> torch.Tensor:
        length = meta.decode_slots.shape[1]
        key_pos = torch.arange(length).unsqueeze(0)  # [1, L]
        too_old = key_pos <= (meta.decode_positions.unsqueeze(1) - self.sliding_window)
        return torch.zeros(too_old.shape).masked_fill_(too_old, float("-inf"))[:, None, None, :]

    def _prefill(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, p: PrefillSeq) -> torch.Tensor:
        # q: [Q, H, D]; keys/values: [C, Hkv, D]; query i sits at position C - Q + i.
        qh = q.transpose(0, 1).unsqueeze(0)  # [1, H, Q, D]
        kh = keys.transpose(0, 1).unsqueeze(0)  # [1, Hkv, C, D]
        vh = values.transpose(0, 1).unsqueeze(0)
        if self.logit_softcap is None and self.sliding_window is None and p.query_len == p.context_len:
            o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=self.scale, enable_gqa=True)
        else:
            mask = self._prefill_mask(p)
            if self.logit_softcap is None:
                o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=self.scale, enable_gqa=True)
            else:
                g = self.num_heads // self.num_kv_heads
                kh, vh = kh.repeat_interleave(g, dim=1), vh.repeat_interleave(g, dim=1)
                scores = torch.matmul(qh, kh.transpose(-1, -2)).float() * self.scale
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
