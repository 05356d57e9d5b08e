"""Gemma 3 (text): Gemma 2's layer with q/k norms instead of attention soft-capping, five sliding-window layers
per full one, and a separate rope base (no scaling) for the sliding layers."""
from __future__ import annotations

from torch import nn

from hearth.config import HFConfig
from hearth.layers.qkv_attention import QKVAttention
from hearth.layers.rotary import get_rope
from hearth.models.gemma import gemma_norm
from hearth.models.gemma2 import Gemma2ForCausalLM


def rope_config(cfg: HFConfig, kind: str) -> HFConfig:
    """The config get_rope should see for one layer kind.

    transformers >= 5 nests rope_parameters by layer kind; older configs give rope_theta and rope_scaling for
    full layers and rope_local_base_freq for sliding ones.
    """
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict) and isinstance(rp.get(kind), dict):
        return HFConfig({**cfg, "rope_scaling": None, "rope_parameters": rp[kind]})
    if kind == "sliding_attention":
        return HFConfig({**cfg, "rope_theta": cfg.get("rope_local_base_freq") or 10000.0, "rope_scaling": None,
                         "rope_parameters": None})
    return cfg


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    sliding_pattern = 6

    def make_rope(self, cfg: HFConfig, kind: str, max_len: int) -> nn.Module:
        return get_rope(rope_config(cfg, kind), cfg.head_dim_, max_len)

    def make_attention(self, cfg: HFConfig, kind: str, rope: nn.Module, **norms: nn.Module) -> QKVAttention:
        return super().make_attention(cfg, kind, rope, q_norm=gemma_norm(cfg, cfg.head_dim_),
                                      k_norm=gemma_norm(cfg, cfg.head_dim_))
