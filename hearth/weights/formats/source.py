"""PackedSource: one linear layer's tensors from a pre-quantized checkpoint, handed to the layer like a weight."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class PackedSource:
    """`tensors` by their checkpoint suffix (qweight, qzeros, scales, g_idx; weight_packed, weight_scale, ...);
    `shape` the dequantized weight's [N, K]; `layout` the hearth layout it repacks into ("int4" or "int8")."""

    method: str  # a source-format key of the layout table's packs: "gptq", "awq", "compressed-tensors"
    bits: int
    group: int  # weights per scale along K (K itself for per-channel)
    shape: tuple[int, int]
    tensors: dict[str, torch.Tensor]
    options: dict = field(default_factory=dict)  # format details (GPTQ: zero_offset)

    @property
    def layout(self) -> str:
        if self.method == "bitsandbytes" and self.bits == 4:
            return "nf4"  # (NF4 and FP4: a 16-value codebook)
        return "int4" if self.bits == 4 else "int8"

    def input_perm(self) -> torch.Tensor | None:
        """The column order the packed weight is in (GPTQ act-order: x is gathered by it at run time), else None."""
        from hearth.weights.formats import gptq

        return gptq.input_perm(self) if self.method == "gptq" else None

    def dequantize(self) -> torch.Tensor:
        """fp32 [N, K] in the checkpoint's column order (a layer kept dense: some of its shards are not quantized)."""
        from hearth.weights.formats import bitsandbytes
        from hearth.weights.layouts import BY_NAME
        from hearth.weights.reference import dequantize

        if self.layout == "nf4":  # (its blocks may straddle rows: no layout holds it, so bitsandbytes' floats)
            return bitsandbytes.dequantize_4bit(self.tensors)
        w = dequantize(BY_NAME[self.layout].packs[self.method](self))
        perm = self.input_perm()
        return w if perm is None else w[:, torch.argsort(perm)]
