"""Llama family: Llama 2/3/3.x, TinyLlama, SmolLM2, Mistral, Qwen2 (qkv bias) share this graph."""
from __future__ import annotations

import torch
from torch import nn

from hearth.config import HFConfig
from hearth.layers.activation import ACT_AND_MUL
from hearth.layers.attention import Attention, AttentionMetadata
from hearth.layers.embedding import Embedding
from hearth.layers.linear import Linear
from hearth.layers.norm import RMSNorm
from hearth.layers.rotary import get_rope
from hearth.models.blocks import PreNormDecoderLayer
from hearth.models.common import CausalLMBase


class LlamaAttention(nn.Module):
    def __init__(self, cfg: HFConfig, max_len: int, qkv_bias: bool, sliding_window: int | None = None) -> None:
        super().__init__()
        self.num_heads = cfg["num_attention_heads"]
        self.num_kv_heads = cfg.num_kv_heads_
        self.head_dim = cfg.head_dim_
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = Linear(cfg["hidden_size"], q + 2 * kv, bias=qkv_bias, shard_sizes={"q": q, "k": kv, "v": kv})
        # HF Llama's attention_bias covers o_proj too; Qwen2's qkv bias does not.
        self.o_proj = Linear(q, cfg["hidden_size"], bias=qkv_bias and bool(cfg.get("attention_bias", False)))
        self.rotary_emb = get_rope(cfg, self.head_dim, max_len)
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim ** -0.5, sliding_window)
        self.q_size, self.kv_size = q, kv

    def forward(self, positions: torch.Tensor, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)  # [T, H, D]
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v, meta))


class LlamaMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, act: str, bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = Linear(hidden, 2 * intermediate, bias=bias,
                                   shard_sizes={"gate": intermediate, "up": intermediate})
        self.down_proj = Linear(intermediate, hidden, bias=bias)
        self.act_and_mul = ACT_AND_MUL[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_and_mul(self.gate_up_proj(x)))


class LlamaDecoderLayer(PreNormDecoderLayer):
    def __init__(self, cfg: HFConfig, max_len: int, qkv_bias: bool, sliding_window: int | None) -> None:
        eps = cfg.get("rms_norm_eps", 1e-6)
        super().__init__(
            attn=LlamaAttention(cfg, max_len, qkv_bias, sliding_window),
            mlp=LlamaMLP(cfg["hidden_size"], cfg["intermediate_size"], cfg.get("hidden_act", "silu"),
                         bool(cfg.get("mlp_bias", False))),
            input_norm=RMSNorm(cfg["hidden_size"], eps),
            pre_mlp_norm=RMSNorm(cfg["hidden_size"], eps))


class LlamaModel(nn.Module):
    def __init__(self, cfg: HFConfig, max_len: int, qkv_bias: bool = False) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg["vocab_size"], cfg["hidden_size"])
        sliding_window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, max_len, qkv_bias, sliding_window)
                                    for _ in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            x, residual = layer(positions, x, residual, meta)
        x, _ = self.norm(x, residual)
        return x


class LlamaForCausalLM(CausalLMBase):
    qkv_bias = False

    def __init__(self, cfg: HFConfig, max_len: int) -> None:
        super().__init__()
        self.tie_word_embeddings = bool(cfg.get("tie_word_embeddings", False))
        self.model = LlamaModel(cfg, max_len, qkv_bias=self.qkv_bias or bool(cfg.get("attention_bias", False)))
        if not self.tie_word_embeddings:
            self.lm_head = Linear(cfg["hidden_size"], cfg["vocab_size"])

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, meta)


class MistralForCausalLM(LlamaForCausalLM):
    pass


class Qwen2ForCausalLM(LlamaForCausalLM):
    qkv_bias = True
