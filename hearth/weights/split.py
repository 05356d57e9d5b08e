"""Tensor parallelism's slice of one linear layer's weights, cut before they are packed into this rank's layout.

    Slice                  what one rank keeps of a layer: output row ranges (column-parallel), an input column
                           range (row-parallel), or nothing (another rank's MoE expert)
    rows(parts, ...)       the kept rows of the layer's source shards: float rows and GGUF block rows are cut as
                           they are (rows are independent in every format); a pre-quantized shard is repacked into
                           its QWeight first (packed along N in format-specific words) and cut there
    cols(qw, start, size)  input columns of a layer packed whole into plain rows: whole 32-weight int4 blocks and
                           whole quantization groups, so every kept weight and scale is the one a single rank holds

The packing and re-layout (VNNI panels, tiles) then run on the slice only, so each rank's layout is its own.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hearth.weights.formats.source import PackedSource
from hearth.weights.gguf import GGUFBlocks
from hearth.weights.layouts import BY_NAME
from hearth.weights.packed import QWeight

Part = torch.Tensor | GGUFBlocks | PackedSource | QWeight


@dataclass(frozen=True)
class Slice:
    """One rank's part of a layer (`name` for errors). rows: (start, size) ranges of the merged output rows, in
    order; cols: the (start, size) input columns; neither: the rank drops the layer (another rank's expert)."""

    name: str
    rows: tuple[tuple[int, int], ...] | None = None
    cols: tuple[int, int] | None = None

    @property
    def drop(self) -> bool:
        return self.rows is None and self.cols is None


def _part_rows(p: Part, start: int, size: int) -> Part:
    if isinstance(p, GGUFBlocks):
        return GGUFBlocks(p.ggml_type, (size, p.shape[1]), p.data.narrow(0, start, size))
    if isinstance(p, PackedSource):
        p = BY_NAME[p.layout].packs[p.method](p)
    if isinstance(p, QWeight):
        return p.rows(start, size)
    return p.narrow(0, start, size)


def rows(parts: list[Part], keep: tuple[tuple[int, int], ...]) -> list[Part]:
    """The rows `keep` (merged-row ranges) of a layer whose shards `parts` hold its rows in order."""
    out, offsets, o = [], [], 0
    for p in parts:
        offsets.append(o)
        o += p.shape[0]
    for start, size in keep:
        for p, off in zip(parts, offsets):
            lo, hi = max(start, off), min(start + size, off + p.shape[0])
            if lo < hi:
                out.append(_part_rows(p, lo - off, hi - lo))
    return out


def dense_rows(w: torch.Tensor, keep: tuple[tuple[int, int], ...]) -> torch.Tensor:
    return torch.cat([w[s:s + n] for s, n in keep])


def cols(qw: QWeight, start: int, size: int, name: str) -> QWeight:
    """Input columns [start, start + size) of a weight in plain rows, exactly. Raises ValueError (one line naming
    the fix) where the slice would cut a quantization group or an int4 block of 32."""
    n, k = qw.shape
    if qw.panel_rows or qw.tiled:
        raise ValueError(f"{name}: a re-laid weight cannot be split by columns (split before the re-layout)")
    g, per = qw.group, (2 if qw.bits == 4 else 1)
    unit = 32 if g == k else max(g, 32)  # (the kernels take K in 32s; int4 bytes hold 32-weight blocks)
    if start % unit or size % unit:
        raise ValueError(f"tensor parallelism cannot split {name}: its {k} inputs split {k // size} ways give "
                         f"{size} columns, not a multiple of its {unit}-weight quantization groups; "
                         "use a --tensor-parallel-size that divides the groups evenly")
    data = qw.data[:, start // per:(start + size) // per].contiguous()
    if g == k:  # one scale (and min) per row: every column keeps it
        return QWeight(qw.bits, size, data, qw.scales, qw.mins, codebook=qw.codebook)
    scales = qw.scales[:, start // g:(start + size) // g].contiguous()
    mins = None if qw.mins is None else qw.mins[:, start // g:(start + size) // g].contiguous()
    return QWeight(qw.bits, g, data, scales, mins, codebook=qw.codebook)
