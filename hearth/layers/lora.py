"""LoRA on the decoder's projections: the base projection runs once for every row of the step, whatever kernel and
weight format it has; then each adapter in the step adds its low-rank delta to its own rows, (x A^T) B^T, grouped
by adapter as Punica's / vLLM's SGMV shrink and expand are (here two torch matmuls per adapter and layer).

A wrapped layer holds up to max_loras adapters' weights, one per slot; which adapter sits in which slot, and which
rows each slot gets this step, are the engine's (hearth.engine.lora_pool), told to every layer through one LoRARows.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from hearth.layers.linear import Linear
from hearth.layers.mlp import GatedMLP
from hearth.layers.moe import SparseMoE
from hearth.layers.qkv_attention import QKVAttention

# (slot, its rows this step: a range when they are contiguous, else their indices, the delta's scale for these rows:
# 1, or a request's own, llama-server's per-request `lora: [{"id", "scale"}]`)
RowGroup = tuple[int, slice | torch.Tensor, float]


@dataclass
class SlotWeights:
    """One adapter's update of one layer. A fused layer (qkv, gate_up) takes each target's A and B into its slices:
    a is every target's A stacked, b places each target's B (times its scale) at its output rows and its rank's
    columns, zero elsewhere, so the delta is (x a^T) b^T whatever subset of the slices the adapter trains."""
    a: torch.Tensor  # [R, in], R: the targets' ranks summed
    b: torch.Tensor  # [out, R]


class LoRARows:
    """This step's rows per adapter slot, shared by every wrapped layer of a model; empty outside a step that has
    adapter rows (the base rows need nothing)."""

    def __init__(self) -> None:
        self.groups: list[RowGroup] = []

    @contextmanager
    def use(self, groups: list[RowGroup]) -> Iterator[None]:
        self.groups = groups
        try:
            yield
        finally:
            self.groups = []


class LoRALinear(nn.Module):
    """A projection plus the low-rank deltas of the adapters in its slots."""

    def __init__(self, base: Linear, rows: LoRARows, max_loras: int) -> None:
        super().__init__()
        self.base = base
        self.rows = rows
        self.slots: list[SlotWeights | None] = [None] * max_loras

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    @property
    def shards(self) -> dict[str, tuple[int, int]]:
        return self.base.shards

    def program_spec(self):
        # NOTE: the decode program has no deltas: DecoderModel runs it only for steps without adapter rows.
        return self.base.program_spec()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        for slot, rows, scale in self.rows.groups:
            w = self.slots[slot]
            if w is None:  # (this adapter does not train this layer)
                continue
            if isinstance(rows, slice):
                delta = (x[rows] @ w.a.T) @ w.b.T
                y[rows] += (delta if scale == 1.0 else delta * scale).to(y.dtype)
            else:
                delta = (x.index_select(0, rows) @ w.a.T) @ w.b.T
                y.index_add_(0, rows, (delta if scale == 1.0 else delta * scale).to(y.dtype))
        return y


def wrap_lora_layers(model: nn.Module, max_loras: int) -> tuple[LoRARows, dict[str, LoRALinear]]:
    """Wrap the projections adapters may train: every attention block's qkv and o, every dense gated MLP's gate_up
    and down (not MoE experts, which run on gathered rows). Returns the shared LoRARows and the wrapped layers by
    module name (model.layers.0.self_attn.qkv_proj)."""
    rows = LoRARows()
    in_moe = {id(m) for moe in model.modules() if isinstance(moe, SparseMoE) for m in moe.modules()}
    targets = []
    for name, module in model.named_modules():
        if isinstance(module, QKVAttention):
            targets += [(name, module, "qkv_proj"), (name, module, "o_proj")]
        elif isinstance(module, GatedMLP) and id(module) not in in_moe:
            targets += [(name, module, "gate_up_proj"), (name, module, "down_proj")]
    wrapped = {}
    for name, parent, attr in targets:
        layer = LoRALinear(getattr(parent, attr), rows, max_loras)
        setattr(parent, attr, layer)
        wrapped[f"{name}.{attr}"] = layer
    return rows, wrapped
