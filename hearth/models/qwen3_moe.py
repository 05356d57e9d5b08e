"""Qwen3-MoE: Qwen3's attention with the shared sparse MoE block (top-k, renormalized if norm_topk_prob)."""
from __future__ import annotations

from torch import nn

from hearth.config import HFConfig
from hearth.layers.mlp import GatedMLP
from hearth.layers.moe import SparseMoE
from hearth.models.qwen3 import Qwen3ForCausalLM


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    def make_mlp(self, cfg: HFConfig, layer: int) -> nn.Module:
        step = cfg.get("decoder_sparse_step") or 1
        num_experts = cfg.get("num_experts") or cfg.get("num_local_experts") or 0
        if layer in (cfg.get("mlp_only_layers") or []) or num_experts == 0 or (layer + 1) % step:
            return GatedMLP(cfg["hidden_size"], cfg["intermediate_size"], cfg.get("hidden_act", "silu"))
        return SparseMoE(cfg["hidden_size"], cfg["moe_intermediate_size"], num_experts, cfg["num_experts_per_tok"],
                         renormalize=bool(cfg.get("norm_topk_prob", False)), act=cfg.get("hidden_act", "silu"))
