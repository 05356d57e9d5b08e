"""Llama family: Llama 2/3/3.x, TinyLlama, SmolLM2, Mistral, Qwen2 (qkv bias) share this graph."""
from __future__ import annotations

import torch

from hearth.config import HFConfig
from hearth.layers.attention import AttentionMetadata
from hearth.layers.linear import Linear
from hearth.layers.mlp import GatedMLP
from hearth.layers.norm import RMSNorm
from hearth.layers.qkv_attention import QKVAttention
from hearth.layers.rotary import RotaryEmbedding, get_rope
from hearth.models.blocks import DecoderModel, PreNormDecoderLayer
from hearth.models.common import CausalLMBase


def llama_layer(cfg: HFConfig, rope: RotaryEmbedding, qkv_bias: bool,
                sliding_window: int | None) -> PreNormDecoderLayer:
    hidden, head_dim, eps = cfg["hidden_size"], cfg.head_dim_, cfg.get("rms_norm_eps", 1e-6)
    # HF Llama's attention_bias covers o_proj too; Qwen2's qkv bias does not.
    attn = QKVAttention(hidden, cfg["num_attention_heads"], cfg.num_kv_heads_, head_dim, rope, head_dim ** -0.5,
                        qkv_bias=qkv_bias, o_bias=qkv_bias and bool(cfg.get("attention_bias", False)),
                        sliding_window=sliding_window)
    mlp = GatedMLP(hidden, cfg["intermediate_size"], cfg.get("hidden_act", "silu"), bool(cfg.get("mlp_bias", False)))
    return PreNormDecoderLayer(attn, mlp, RMSNorm(hidden, eps), RMSNorm(hidden, eps))


class LlamaForCausalLM(CausalLMBase):
    qkv_bias = False

    def __init__(self, cfg: HFConfig, max_len: int) -> None:
        super().__init__()
        self.tie_word_embeddings = bool(cfg.get("tie_word_embeddings", False))
        qkv_bias = self.qkv_bias or bool(cfg.get("attention_bias", False))
        rope = get_rope(cfg, cfg.head_dim_, max_len)  # NOTE: one cos/sin table shared by every layer
        window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
        layers = [llama_layer(cfg, rope, qkv_bias, window) for _ in range(cfg["num_hidden_layers"])]
        self.model = DecoderModel(cfg, layers, RMSNorm(cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)))
        if not self.tie_word_embeddings:
            self.lm_head = Linear(cfg["hidden_size"], cfg["vocab_size"])

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, meta)


class MistralForCausalLM(LlamaForCausalLM):
    pass


class Qwen2ForCausalLM(LlamaForCausalLM):
    qkv_bias = True
