"""A sparse mixture-of-experts block (Mixtral, Qwen3-MoE): a router and top-k gated-MLP experts."""
from __future__ import annotations

import torch
from torch import nn

from hearth.layers.linear import Linear
from hearth.layers.mlp import GatedMLP


class SparseMoE(nn.Module):
    """Router `gate` [E, hidden] + experts.{e} (gate_up_proj, down_proj). Softmax over all experts in float32,
    top-k, optionally renormalized to sum to 1."""

    def __init__(self, hidden: int, intermediate: int, num_experts: int, top_k: int, renormalize: bool,
                 act: str = "silu") -> None:
        super().__init__()
        self.top_k, self.renormalize = top_k, renormalize
        self.gate = Linear(hidden, num_experts)
        self.experts = nn.ModuleList(GatedMLP(hidden, intermediate, act) for _ in range(num_experts))
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
