"""QWeight: a quantized [N, K] weight as the kernels read it (which layout it is in: hearth.weights.layouts.of)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

PANEL_COLS = 64  # output columns per VNNI panel (csrc/quant_panel.cpp)


@dataclass
class QWeight:
    """int8 data [N, K] int8, or int4 data [N, K/2] uint8 where each 16-byte sub-block holds 32 weights (low nibbles =
    elements 0..15, high = 16..31: GGUF Q4_0's order, so Q4_0 / Q4_1 repack as a byte copy); scales (and, int4, mins)
    fp32 [N, K/group], or fp16 for GGUF Q8_0 / Q4_0 / Q4_1 (their own scales, exact). Dequantized weight: int8 q * s;
    int4 q * s + min (q in 0..15), one fma, which is exactly gguf.quants.dequantize's floats for the GGUF types."""

    bits: int  # 8 or 4 (6: GGUF Q6_K tiles)
    group: int  # weights per scale along K (a multiple of 32 dividing K; K itself for per-channel int8; int8: 16)
    data: torch.Tensor  # int8 [N, K] | uint8 [N, K/2]
    scales: torch.Tensor  # fp32 [N, K/group], or fp16 (GGUF's own scales, see scale_f16)
    mins: torch.Tensor | None  # [N, K/group] like scales, int4 only; None for symmetric int4 (GGUF Q4_0): -8 scale
    # 4-row tiles (relayout.tile_rows4: int4 group 32; gguf.repack_q6_tiles: bits 6, GGUF Q6_K): `data` holds the
    # tiles with the scales (and mins) inline, uint8 [N, the plain row's bytes]; `scales` (and `mins`, if any) are
    # then empty [N, 0] tensors that only carry the dtype.
    tiled: bool = False
    # VNNI panels (relayout.to_panels): `data` uint8 [ceil(N / 64), panel bytes], `scales` (and `mins`)
    # [panels, K / group * 64]; panel_rows is N then (0: another layout).
    panel_rows: int = 0
    # The rounding of x its kernels take ("int8x2", "int8", "float"); None: the process-wide default
    # (hearth.weights.activations). Set per model by the prepare pass.
    activations: str | None = None
    # A 16-value fp32 codebook (bitsandbytes NF4 / FP4): 4-bit data are its indices and w = codebook[q] * scale
    # (the block's absmax; mins None). None: the integer layouts above.
    codebook: torch.Tensor | None = None
    # The kernels' descriptor of this weight (hearth.kernels.weight.Weight, csrc/hk_api.h hk_weight), built on its
    # first call by hearth.weights.apply.descriptor; rows() / index_rows() views start without one.
    desc: object | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.scales.dtype not in (torch.float32, torch.float16) or (
                self.mins is not None and self.mins.dtype != self.scales.dtype):
            raise ValueError(f"QWeight scales must be fp32 or fp16 and mins the same type, got {self.scales.dtype}"
                             f" / {None if self.mins is None else self.mins.dtype}")

    @property
    def scale_f16(self) -> bool:
        """Scales (and mins) stored as fp16: GGUF Q8_0 / Q4_0 / Q4_1 keep theirs (2 bytes a block, not 4; exact)."""
        return self.scales.dtype == torch.float16

    @property
    def shape(self) -> tuple[int, int]:
        n, b = self.data.shape
        if self.panel_rows:
            return self.panel_rows, self.scales.shape[1] // PANEL_COLS * self.group
        if self.bits == 6:  # 210 bytes per 256 weights
            return n, b // 210 * 256
        if self.tiled:  # b = K / 2 + K / 32 * scale bytes * (1 + has mins)
            return n, 32 * b // (16 + self.scales.element_size() * (1 if self.mins is None else 2))
        return n, b * 2 if self.bits == 4 else b

    def rows(self, start: int, size: int) -> QWeight:
        """Rows [start, start + size) as views: plain rows, or whole tiles of 4-row int4 tiles (relayout.plain
        first for panels)."""
        if self.panel_rows:
            raise ValueError("rows() of a weight in VNNI panels: take relayout.plain(qw) first")
        if self.tiled and (start % 4 or size % 4):
            raise ValueError(f"rows({start}, {size}) of a 4-row-tiled weight must be whole tiles")
        return QWeight(self.bits, self.group, self.data.narrow(0, start, size), self.scales.narrow(0, start, size),
                       None if self.mins is None else self.mins.narrow(0, start, size), tiled=self.tiled,
                       codebook=self.codebook)

    def index_rows(self, index: torch.Tensor) -> QWeight:
        """Rows in `index` order (copies) of a weight in plain rows (relayout.plain first for tiles and panels):
        rows of block formats are independent, so a row permutation is exact."""
        if self.panel_rows or self.tiled:
            raise ValueError("index_rows() of a re-laid weight: take relayout.plain(qw) first")
        return QWeight(self.bits, self.group, self.data[index], self.scales[index],
                       None if self.mins is None else self.mins[index], codebook=self.codebook)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.data, self.scales, self.mins) if t is not None)


def pack_u4(q: torch.Tensor) -> torch.Tensor:
    """q uint8 [N, K] (0..15) -> [N, K/2]: per 32 weights, byte j = q[j] | q[j + 16] << 4."""
    n, k = q.shape
    q = q.reshape(n, k // 32, 2, 16)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(n, k // 2).contiguous()


def unpack_u4(data: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_u4: [N, K/2] -> uint8 [N, K]."""
    n, kb = data.shape
    d = data.reshape(n, kb // 16, 1, 16)
    return torch.cat([d & 0x0F, d >> 4], dim=2).reshape(n, kb * 2)


def panel_scales(s: torch.Tensor | None) -> torch.Tensor | None:
    """Per-row scales (or mins) [N, K / group] -> the panels' [ceil(N / 64), K / group * 64] (rows past N: zero)."""
    if s is None:
        return None
    p = -(-s.shape[0] // PANEL_COLS)
    return (F.pad(s, (0, 0, 0, p * PANEL_COLS - s.shape[0])).reshape(p, PANEL_COLS, -1).transpose(1, 2)
            .reshape(p, -1).contiguous())


def supports(k: int, group: int) -> bool:
    """Shapes the layouts (and kernels) take: K a multiple of 32; the group a multiple of 32 dividing K, or 16 (int8
    only: GGUF Q6_K's sub-blocks)."""
    return k % 32 == 0 and (group == 16 or (group % 32 == 0 and group > 0 and k % group == 0))
