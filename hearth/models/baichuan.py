"""Baichuan / Baichuan 2 (7B, 13B): the Llama graph (multi-head) with q, k, v packed in one W_pack projection and,
for Baichuan 2, a NormHead lm_head (rows L2-normalized at inference; done once after loading).

The 7B models use rotary embeddings; the 13B ones ALiBi instead (no rotary, a per-head linear bias on the scores),
told apart as Baichuan's own code does: their configs have no max_position_embeddings (only model_max_length).
The checkpoints ship remote code (auto_map); hearth never runs it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hearth.config import HFConfig
from hearth.layers.attention import Attention, AttentionMetadata, alibi_slopes
from hearth.layers.linear import Linear
from hearth.layers.mlp import GatedMLP
from hearth.layers.norm import RMSNorm
from hearth.layers.qkv_attention import QKVAttention
from hearth.layers.rotary import get_rope
from hearth.models.blocks import DecoderModel, PreNormDecoderLayer
from hearth.models.common import CausalLMBase

BAICHUAN2_VOCAB = 125696  # Baichuan 2's tokenizer; only Baichuan 2 normalizes its lm_head


class _NoRope(nn.Module):
    """ALiBi models rotate nothing: positions enter through the attention bias."""

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k


def _attention(cfg: HFConfig, max_len: int, alibi: bool) -> QKVAttention:
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    head_dim = hidden // heads
    if not alibi:
        return QKVAttention(hidden, heads, heads, head_dim, get_rope(cfg, head_dim, max_len), head_dim ** -0.5)
    attn = QKVAttention(hidden, heads, heads, head_dim, _NoRope(), head_dim ** -0.5)
    attn.attn = Attention(heads, heads, head_dim, head_dim ** -0.5, alibi_slopes=alibi_slopes(heads))
    return attn


class BaichuanForCausalLM(CausalLMBase):
    def __init__(self, cfg: HFConfig, max_len: int) -> None:
        super().__init__()
        hidden, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        # NOTE: 13B configs give only model_max_length: ALiBi models (as Baichuan's own code decides).
        alibi = "max_position_embeddings" not in cfg
        layers = [PreNormDecoderLayer(
            _attention(cfg, max_len, alibi),
            GatedMLP(hidden, cfg["intermediate_size"], cfg.get("hidden_act", "silu")),
            RMSNorm(hidden, eps), RMSNorm(hidden, eps)) for _ in range(cfg["num_hidden_layers"])]
        self.model = DecoderModel(cfg, layers, RMSNorm(hidden, eps))
        self.lm_head = Linear(hidden, cfg["vocab_size"])
        # NOTE: config.json has no flag for NormHead; `norm_head` (hearth's key) overrides the vocab-size rule.
        self.norm_head = bool(cfg.get("norm_head", cfg["vocab_size"] == BAICHUAN2_VOCAB))

    def _rename(self, name: str) -> str | None:
        name = super()._rename(name)  # W_pack is exactly our fused qkv_proj (q, k, v rows in that order)
        return None if name is None else name.replace(".W_pack.", ".qkv_proj.")

    def after_load(self) -> None:
        if self.norm_head:
            self.lm_head.weight.data = F.normalize(self.lm_head.weight.data.float(), dim=-1).to(
                self.lm_head.weight.dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, meta)
