"""Qwen3: the Llama graph with an RMSNorm on each query and key head before rotary."""
from __future__ import annotations

import torch

from hearth.config import HFConfig
from hearth.layers.attention import AttentionMetadata
from hearth.layers.linear import Linear
from hearth.layers.mlp import GatedMLP
from hearth.layers.norm import RMSNorm
from hearth.layers.qkv_attention import QKVAttention
from hearth.layers.rotary import get_rope
from hearth.models.blocks import DecoderModel, PreNormDecoderLayer, sliding_windows
from hearth.models.common import CausalLMBase


def qwen3_attention(cfg: HFConfig, rope, sliding_window: int | None) -> QKVAttention:
    head_dim, eps, bias = cfg.head_dim_, cfg.get("rms_norm_eps", 1e-6), bool(cfg.get("attention_bias", False))
    return QKVAttention(cfg["hidden_size"], cfg["num_attention_heads"], cfg.num_kv_heads_, head_dim, rope,
                        head_dim ** -0.5, qkv_bias=bias, o_bias=bias, sliding_window=sliding_window,
                        q_norm=RMSNorm(head_dim, eps), k_norm=RMSNorm(head_dim, eps))


class Qwen3ForCausalLM(CausalLMBase):
    def __init__(self, cfg: HFConfig, max_len: int) -> None:
        super().__init__()
        hidden, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        rope = get_rope(cfg, cfg.head_dim_, max_len)
        layers = [PreNormDecoderLayer(qwen3_attention(cfg, rope, window), self.make_mlp(cfg, i),
                                      RMSNorm(hidden, eps), RMSNorm(hidden, eps))
                  for i, window in enumerate(sliding_windows(cfg))]
        self.model = DecoderModel(cfg, layers, RMSNorm(hidden, eps))
        self.tie_word_embeddings = bool(cfg.get("tie_word_embeddings", False))
        if not self.tie_word_embeddings:
            self.lm_head = Linear(hidden, cfg["vocab_size"])

    def make_mlp(self, cfg: HFConfig, layer: int) -> torch.nn.Module:
        return GatedMLP(cfg["hidden_size"], cfg["intermediate_size"], cfg.get("hidden_act", "silu"))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, meta)
