"""OLMo (1): the Llama graph with non-parametric LayerNorms and optional clamping of q, k, v (clip_qkv)."""
from __future__ import annotations

import torch

from hearth.config import HFConfig
from hearth.layers.attention import AttentionMetadata
from hearth.layers.linear import Linear
from hearth.layers.mlp import GatedMLP
from hearth.layers.norm import LayerNorm
from hearth.layers.qkv_attention import QKVAttention
from hearth.layers.rotary import get_rope
from hearth.models.blocks import DecoderModel, PreNormDecoderLayer
from hearth.models.common import CausalLMBase


class OlmoForCausalLM(CausalLMBase):
    def __init__(self, cfg: HFConfig, max_len: int) -> None:
        super().__init__()
        hidden, head_dim = cfg["hidden_size"], cfg.head_dim_
        bias = bool(cfg.get("attention_bias", False))
        rope = get_rope(cfg, head_dim, max_len)

        def norm() -> LayerNorm:
            return LayerNorm(hidden, 1e-5, affine=False)

        layers = [PreNormDecoderLayer(
            QKVAttention(hidden, cfg["num_attention_heads"], cfg.num_kv_heads_, head_dim, rope, head_dim ** -0.5,
                         qkv_bias=bias, o_bias=bias, clip_qkv=cfg.get("clip_qkv")),
            GatedMLP(hidden, cfg["intermediate_size"], cfg.get("hidden_act", "silu")), norm(), norm())
            for _ in range(cfg["num_hidden_layers"])]
        self.model = DecoderModel(cfg, layers, norm())
        self.tie_word_embeddings = bool(cfg.get("tie_word_embeddings", False))
        if not self.tie_word_embeddings:
            self.lm_head = Linear(hidden, cfg["vocab_size"])

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, meta)
