"""The gated MLP of most decoder families (Llama's): a layer type of its own, for tensor parallelism and MoE experts."""
from __future__ import annotations

import torch
from torch import nn

from hearth.layers.activation import ACT_AND_MUL, gelu_tanh_and_mul, silu_and_mul
from hearth.layers.linear import Linear


class GatedMLP(nn.Module):
    """act(gate) * up, then down: gate and up fused in one projection (Llama's MLP and most families')."""

    def __init__(self, hidden: int, intermediate: int, act: str, bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = Linear(hidden, 2 * intermediate, bias=bias,
                                   shard_sizes={"gate": intermediate, "up": intermediate})
        self.down_proj = Linear(intermediate, hidden, bias=bias)
        self.act_and_mul = ACT_AND_MUL[act]

    def program_spec(self) -> dict | None:
        """The gated MLP's part of a decoder layer's LayerSpec (None: an activation the program lacks)."""
        act = {silu_and_mul: 0, gelu_tanh_and_mul: 1}.get(self.act_and_mul)
        if act is None:
            return None
        return {"gate_up": self.gate_up_proj.program_spec(), "down": self.down_proj.program_spec(), "act": act}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_and_mul(self.gate_up_proj(x)))
