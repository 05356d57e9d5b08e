"""Mixtral: the Llama graph with a sparse MoE MLP (top-2 of 8 experts, weights renormalized over the chosen).

The MoE block is shared with Qwen3-MoE. Experts run grouped: tokens are sorted by the expert they were routed to,
each expert multiplies its contiguous slice in one matmul, and results are scattered back weighted.
"""
from __future__ import annotations

import torch
from torch import nn

from hearth.config import HFConfig
from hearth.layers.attention import AttentionMetadata
from hearth.layers.linear import Linear
from hearth.layers.moe import SparseMoE
from hearth.layers.norm import RMSNorm
from hearth.layers.qkv_attention import QKVAttention
from hearth.layers.rotary import get_rope
from hearth.models.blocks import DecoderModel, PreNormDecoderLayer, sliding_windows
from hearth.models.common import MERGED_PROJECTIONS, CausalLMBase


class MixtralForCausalLM(CausalLMBase):
    merged = {**MERGED_PROJECTIONS, "w1": ("gate_up_proj", "gate"), "w3": ("gate_up_proj", "up")}

    def __init__(self, cfg: HFConfig, max_len: int) -> None:
        super().__init__()
        hidden, head_dim, eps = cfg["hidden_size"], cfg.head_dim_, cfg.get("rms_norm_eps", 1e-5)
        rope = get_rope(cfg, head_dim, max_len)
        layers = [PreNormDecoderLayer(
            QKVAttention(hidden, cfg["num_attention_heads"], cfg.num_kv_heads_, head_dim, rope, head_dim ** -0.5,
                         sliding_window=window),
            self.make_moe(cfg, i), RMSNorm(hidden, eps), RMSNorm(hidden, eps))
            for i, window in enumerate(sliding_windows(cfg))]
        self.model = DecoderModel(cfg, layers, RMSNorm(hidden, eps))
        self.tie_word_embeddings = bool(cfg.get("tie_word_embeddings", False))
        if not self.tie_word_embeddings:
            self.lm_head = Linear(hidden, cfg["vocab_size"])

    def make_moe(self, cfg: HFConfig, layer: int) -> nn.Module:
        return SparseMoE(cfg["hidden_size"], cfg["intermediate_size"], cfg["num_local_experts"],
                         cfg["num_experts_per_tok"], renormalize=True, act=cfg.get("hidden_act", "silu"))

    def _rename(self, name: str) -> str | None:
        # HF: layers.N.block_sparse_moe.experts.E.{w1,w3,w2} -> ours: layers.N.mlp.experts.E.{gate_up_proj,down_proj}
        name = super()._rename(name)
        return None if name is None else name.replace(".block_sparse_moe.", ".mlp.").replace(".w2.", ".down_proj.")

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, meta)
