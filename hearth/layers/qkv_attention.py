"""The decoder's attention block: a fused qkv projection, optional q/k norms, rotary embedding, paged attention and
the output projection. A layer type of its own, so tensor parallelism and the decode program know it by type."""
from __future__ import annotations

import torch
from torch import nn

from hearth.layers.attention import Attention, AttentionMetadata
from hearth.layers.linear import Linear
from hearth.layers.rotary import RotaryEmbedding


def program_spec_of(module: nn.Module | None):
    """module.program_spec() if the module describes itself to the decode program, else None."""
    describe = getattr(module, "program_spec", None)
    return describe() if describe is not None else None


class QKVAttention(nn.Module):
    """Attention with a fused qkv projection. q_norm/k_norm (optional) see [T, H, D] when per_head, else the
    flat [T, H * D] projections (OLMo2). clip_qkv clamps the fused projection (OLMo)."""

    def __init__(self, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int, rope: RotaryEmbedding,
                 scale: float, *, qkv_bias: bool = False, o_bias: bool = False, sliding_window: int | None = None,
                 logit_softcap: float | None = None, q_norm: nn.Module | None = None,
                 k_norm: nn.Module | None = None, per_head_norm: bool = True, clip_qkv: float | None = None) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_size, self.kv_size = num_heads * head_dim, num_kv_heads * head_dim
        self.qkv_proj = Linear(hidden, self.q_size + 2 * self.kv_size, bias=qkv_bias,
                               shard_sizes={"q": self.q_size, "k": self.kv_size, "v": self.kv_size})
        self.o_proj = Linear(self.q_size, hidden, bias=o_bias)
        self.q_norm, self.k_norm, self.per_head_norm = q_norm, k_norm, per_head_norm
        self.clip_qkv = clip_qkv
        self.rotary_emb = rope  # NOTE: shared by every layer of one kind; not a checkpoint tensor
        self.attn = Attention(num_heads, num_kv_heads, head_dim, scale, sliding_window, logit_softcap)

    def program_spec(self) -> dict | None:
        """The attention's part of a decoder layer's LayerSpec (None: clipping, flat q/k norms, or a part the
        program cannot run)."""
        if self.clip_qkv is not None or (self.q_norm is not None and not self.per_head_norm):
            return None
        spec = {"qkv": program_spec_of(self.qkv_proj), "o": program_spec_of(self.o_proj),
                "attn": program_spec_of(self.attn), "rope": program_spec_of(self.rotary_emb)}
        if self.q_norm is not None:
            spec["q_norm"], spec["k_norm"] = program_spec_of(self.q_norm), program_spec_of(self.k_norm)
        return None if any(v is None for v in spec.values()) else spec

    def forward(self, positions: torch.Tensor, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        if self.clip_qkv is not None:
            qkv = qkv.clamp(-self.clip_qkv, self.clip_qkv)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.q_norm is not None and not self.per_head_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.reshape(-1, self.num_heads, self.head_dim)  # [T, H, D]
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.per_head_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v, meta))
