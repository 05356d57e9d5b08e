"""OLMo 2: norms after attention and MLP instead of before (x + norm(f(x))), and RMSNorms over the whole q and k
projections (all heads at once) before rotary."""
from __future__ import annotations

import torch
from torch import nn

from hearth.config import HFConfig
from hearth.layers.attention import AttentionMetadata
from hearth.layers.linear import Linear
from hearth.layers.mlp import GatedMLP
from hearth.layers.norm import RMSNorm
from hearth.layers.qkv_attention import QKVAttention
from hearth.layers.rotary import get_rope
from hearth.models.blocks import DecoderModel
from hearth.models.common import CausalLMBase


class Olmo2DecoderLayer(nn.Module):
    def __init__(self, cfg: HFConfig, rope: nn.Module) -> None:
        super().__init__()
        hidden, head_dim, eps = cfg["hidden_size"], cfg.head_dim_, cfg.get("rms_norm_eps", 1e-6)
        heads, kv_heads = cfg["num_attention_heads"], cfg.num_kv_heads_
        bias = bool(cfg.get("attention_bias", False))
        self.self_attn = QKVAttention(hidden, heads, kv_heads, head_dim, rope, head_dim ** -0.5, qkv_bias=bias,
                                      o_bias=bias, q_norm=RMSNorm(heads * head_dim, eps),
                                      k_norm=RMSNorm(kv_heads * head_dim, eps), per_head_norm=False)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = GatedMLP(hidden, cfg["intermediate_size"], cfg.get("hidden_act", "silu"))
        self.post_feedforward_layernorm = RMSNorm(hidden, eps)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None,
                meta: AttentionMetadata) -> tuple[torch.Tensor, None]:
        x = x + self.post_attention_layernorm(self.self_attn(positions, x, meta))
        return x + self.post_feedforward_layernorm(self.mlp(x)), None


class Olmo2ForCausalLM(CausalLMBase):
    def __init__(self, cfg: HFConfig, max_len: int) -> None:
        super().__init__()
        rope = get_rope(cfg, cfg.head_dim_, max_len)
        layers = [Olmo2DecoderLayer(cfg, rope) for _ in range(cfg["num_hidden_layers"])]
        self.model = DecoderModel(cfg, layers, RMSNorm(cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)))
        self.tie_word_embeddings = bool(cfg.get("tie_word_embeddings", False))
        if not self.tie_word_embeddings:
            self.lm_head = Linear(cfg["hidden_size"], cfg["vocab_size"])

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, meta)
