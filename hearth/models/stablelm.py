"""StableLM (2): LayerNorms with bias, partial rotary, optional qkv bias, optional per-head q/k LayerNorms and
an optional parallel residual (attention and MLP both read the same normed input)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hearth.config import HFConfig
from hearth.layers.attention import AttentionMetadata
from hearth.layers.linear import Linear
from hearth.layers.mlp import GatedMLP
from hearth.layers.norm import LayerNorm
from hearth.layers.qkv_attention import QKVAttention
from hearth.layers.rotary import get_rope
from hearth.models.blocks import DecoderModel, PreNormDecoderLayer, rotary_dim
from hearth.models.common import CausalLMBase


class PerHeadLayerNorm(nn.Module):
    """A separate bias-free LayerNorm per head (checkpoint: norms.{h}.weight), applied to [T, H, D] at once."""

    def __init__(self, head_dim: int, num_heads: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.norms = nn.ModuleList(LayerNorm(head_dim, eps, bias=False) for _ in range(num_heads))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = torch.stack([n.weight for n in self.norms]).float()  # [H, D]
        return (F.layer_norm(x.float(), x.shape[-1:], eps=self.eps) * weight).to(x.dtype)


class ParallelDecoderLayer(nn.Module):
    """x -> x + attn(norm(x)) + mlp(norm(x))."""

    def __init__(self, attn: nn.Module, mlp: nn.Module, norm: nn.Module) -> None:
        super().__init__()
        self.input_layernorm, self.self_attn, self.mlp = norm, attn, mlp

    def forward(self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None,
                meta: AttentionMetadata) -> tuple[torch.Tensor, None]:
        h = self.input_layernorm(x)
        return x + self.self_attn(positions, h, meta) + self.mlp(h), None


class StableLmForCausalLM(CausalLMBase):
    def __init__(self, cfg: HFConfig, max_len: int) -> None:
        super().__init__()
        hidden, head_dim, eps = cfg["hidden_size"], cfg.head_dim_, cfg.get("layer_norm_eps", 1e-5)
        heads, kv_heads = cfg["num_attention_heads"], cfg.num_kv_heads_
        rope = get_rope(cfg, head_dim, max_len, rotary_dim(cfg, head_dim))
        layers: list[nn.Module] = []
        for _ in range(cfg["num_hidden_layers"]):
            qk = dict(q_norm=PerHeadLayerNorm(head_dim, heads, eps),
                      k_norm=PerHeadLayerNorm(head_dim, kv_heads, eps)) if cfg.get("qk_layernorm") else {}
            attn = QKVAttention(hidden, heads, kv_heads, head_dim, rope, head_dim ** -0.5,
                                qkv_bias=bool(cfg.get("use_qkv_bias")), **qk)
            mlp = GatedMLP(hidden, cfg["intermediate_size"], cfg.get("hidden_act", "silu"))
            if cfg.get("use_parallel_residual"):
                layers.append(ParallelDecoderLayer(attn, mlp, LayerNorm(hidden, eps)))
            else:
                layers.append(PreNormDecoderLayer(attn, mlp, LayerNorm(hidden, eps), LayerNorm(hidden, eps)))
        self.model = DecoderModel(cfg, layers, LayerNorm(hidden, eps))
        self.tie_word_embeddings = bool(cfg.get("tie_word_embeddings", False))
        if not self.tie_word_embeddings:
            self.lm_head = Linear(hidden, cfg["vocab_size"])

    def _rename(self, name: str) -> str | None:
        name = super()._rename(name)  # HF q_layernorm / k_layernorm -> our q_norm / k_norm
        return None if name is None else name.replace(".q_layernorm.", ".q_norm.").replace(".k_layernorm.", ".k_norm.")

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, meta)
