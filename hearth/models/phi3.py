"""Phi-3 / Phi-3.5 / Phi-4-mini: the Llama graph with checkpoint-fused qkv_proj and gate_up_proj (they load
as-is), LongRoPE for the 128k variants, optional partial rotary, a sliding window on every layer if set."""
from __future__ import annotations

import torch

from hearth.config import HFConfig
from hearth.layers.attention import AttentionMetadata
from hearth.layers.linear import Linear
from hearth.layers.mlp import GatedMLP
from hearth.layers.norm import RMSNorm
from hearth.layers.qkv_attention import QKVAttention
from hearth.layers.rotary import get_rope
from hearth.models.blocks import DecoderModel, PreNormDecoderLayer, rotary_dim, sliding_windows
from hearth.models.common import CausalLMBase


def sequence_lengths(positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """[T] tokens in each token's sequence after this step (decodes: position + 1; prefills: context_len)."""
    lens = positions + 1
    for p in meta.prefills:
        lens[p.query_start:p.query_start + p.query_len] = p.context_len
    return lens


class Phi3ForCausalLM(CausalLMBase):
    def __init__(self, cfg: HFConfig, max_len: int) -> None:
        super().__init__()
        hidden, head_dim, eps = cfg["hidden_size"], cfg.head_dim_, cfg.get("rms_norm_eps", 1e-5)
        self.rope = get_rope(cfg, head_dim, max_len, rotary_dim(cfg, head_dim))
        layers = [PreNormDecoderLayer(
            QKVAttention(hidden, cfg["num_attention_heads"], cfg.num_kv_heads_, head_dim, self.rope,
                         head_dim ** -0.5, sliding_window=window),
            GatedMLP(hidden, cfg["intermediate_size"], cfg.get("hidden_act", "silu")),
            RMSNorm(hidden, eps), RMSNorm(hidden, eps)) for window in sliding_windows(cfg)]
        self.model = DecoderModel(cfg, layers, RMSNorm(hidden, eps))
        self.tie_word_embeddings = bool(cfg.get("tie_word_embeddings", False))
        if not self.tie_word_embeddings:
            self.lm_head = Linear(hidden, cfg["vocab_size"])

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        # NOTE: from here on "positions" are rows of the rope table (LongRoPE picks short or long rows).
        rows = self.rope.table_index(positions, sequence_lengths(positions, meta))
        return self.model(input_ids, rows, meta)
