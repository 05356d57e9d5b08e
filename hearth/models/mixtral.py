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
from hearth.layers.norm import RMSNorm
from hearth.layers.rotary import get_rope
from hearth.models.blocks import DecoderModel, PreNormDecoderLayer, QKVAttention, sliding_windows
from hearth.models.common import MERGED_PROJECTIONS, CausalLMBase
from hearth.models.llama import LlamaMLP


class SparseMoE(nn.Module):
    """Router `gate` [E, hidden] + experts.{e} (gate_up_proj, down_proj). Softmax over all experts in float32,
    top-k, optionally renormalized to sum to 1."""

    def __init__(self, hidden: int, intermediate: int, num_experts: int, top_k: int, renormalize: bool,
                 act: str = "silu") -> None:
        super().__init__()
        self.top_k, self.renormalize = top_k, renormalize
        self.gate = Linear(hidden, num_experts)
        self.experts = nn.ModuleList(LlamaMLP(hidden, intermediate, act) for _ in range(num_experts))
        # Tensor parallelism (hearth/distributed/shard.py): the experts this rank runs; None: all of them.
        self.local_experts: list[bool] | None = None
        self.fp32_out = False  # tensor parallelism: return the fp32 sum (all-reduced, then rounded once)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.gate(x).float(), dim=-1)  # [T, E]
        weights, chosen = probs.topk(self.top_k, dim=-1)  # [T, K]
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        flat = chosen.flatten()  # [T * K]: token t's k-th choice at t * K + k
        order = flat.argsort(stable=True)
        token_of = order // self.top_k  # [T * K] token index of each sorted assignment
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()
        out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32)
        start = 0
        for e, (expert, n) in enumerate(zip(self.experts, counts)):
            if n and (self.local_experts is None or self.local_experts[e]):
                rows = token_of[start:start + n]
                y = expert(x[rows]) * weights.flatten()[order[start:start + n]].unsqueeze(1)
                out.index_add_(0, rows, y.float())
            start += n
        return out if self.fp32_out else out.to(x.dtype)


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
