"""Gemma 2: Gemma plus sandwich norms (before and after attention and MLP), attention and final-logit
soft-capping, query_pre_attn_scalar for the attention scale, and sliding-window layers alternating with full."""
from __future__ import annotations

import torch
from torch import nn

from hearth.config import HFConfig
from hearth.kernels.decoder import LayerSpec
from hearth.layers.attention import AttentionMetadata
from hearth.layers.qkv_attention import QKVAttention
from hearth.layers.rotary import get_rope
from hearth.models.blocks import layer_spec, layer_types
from hearth.models.gemma import GemmaBase, gemma_mlp, gemma_norm


class SandwichDecoderLayer(nn.Module):
    """x -> x + post_norm(attn(norm(x))) -> x + post_norm(mlp(norm(x))); residual adds fused into the pre-norms."""

    def __init__(self, cfg: HFConfig, attn: nn.Module) -> None:
        super().__init__()
        self.input_layernorm = gemma_norm(cfg)
        self.self_attn = attn
        self.post_attention_layernorm = gemma_norm(cfg)
        self.pre_feedforward_layernorm = gemma_norm(cfg)
        self.mlp = gemma_mlp(cfg)
        self.post_feedforward_layernorm = gemma_norm(cfg)

    def program_spec(self) -> LayerSpec | None:
        return layer_spec(self.self_attn, self.mlp, self.input_layernorm, self.pre_feedforward_layernorm,
                          self.post_attention_layernorm, self.post_feedforward_layernorm)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None,
                meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = x
            x = self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.post_attention_layernorm(self.self_attn(positions, x, meta))
        x, residual = self.pre_feedforward_layernorm(x, residual)
        return self.post_feedforward_layernorm(self.mlp(x)), residual


class Gemma2ForCausalLM(GemmaBase):
    sliding_pattern = 2  # configs without layer_types: sliding, full, sliding, ...

    def __init__(self, cfg: HFConfig, max_len: int) -> None:
        kinds = layer_types(cfg, self.sliding_pattern)
        ropes = {kind: self.make_rope(cfg, kind, max_len) for kind in sorted(set(kinds))}
        layers = [SandwichDecoderLayer(cfg, self.make_attention(cfg, kind, ropes[kind])) for kind in kinds]
        super().__init__(cfg, layers)

    def make_rope(self, cfg: HFConfig, kind: str, max_len: int) -> nn.Module:
        return get_rope(cfg, cfg.head_dim_, max_len)

    def make_attention(self, cfg: HFConfig, kind: str, rope: nn.Module, **norms: nn.Module) -> QKVAttention:
        head_dim, bias = cfg.head_dim_, bool(cfg.get("attention_bias", False))
        scale = float(cfg.get("query_pre_attn_scalar") or head_dim) ** -0.5
        window = cfg.get("sliding_window") if kind == "sliding_attention" else None
        return QKVAttention(cfg["hidden_size"], cfg["num_attention_heads"], cfg.num_kv_heads_, head_dim, rope,
                            scale, qkv_bias=bias, o_bias=bias, sliding_window=window,
                            logit_softcap=cfg.get("attn_logit_softcapping"), **norms)
