"""Which kernel runs for a weight layout, a row count and this machine: `plan(layout, rows, caps)`.

Linear.forward / QuantLinear.forward (through hearth.weights.apply), the whole-stack decode program (its per-layer
GEMM thresholds and which steps it takes) and `hearth doctor` (which prints `table()`) all ask this module, so the
choice is made in one place. Row-count rules, from the layout table's `kernel` / `gemm` / `gemm_from` columns:
  quantized, "dot" layouts: from gemm_from(layout) rows (or in a prompt step) up to GEMM_MAX_M the fp32-x GEMM
      (hk_linear's "gemm" kernel; from BCAST_MIN_M rows outside prompt steps its broadcast form); fewer rows the dot kernels
      (integer dots, or fp32 with HEARTH_QUANT_ACT=float) up to MAX_QUANT_ROWS; more rows dequantized tiles and
      torch's GEMM ("tiled"). The GEMM runs on AVX-512 only: without VNNI an integer dot costs about an fp32 FMA, so
      it pays once per 8 rows what the dot kernels pay per row; with VNNI the dot kernels keep decode steps of fewer
      than BCAST_MIN_M rows (HEARTH_QUANT_GEMM=1: the GEMM from gemm_from rows anyway, 0: never).
  quantized, "panels": the panel kernel (AVX512-VNNI's body, or AVX2's for int4) at every row count (its per-row sums do not depend on the other rows).
  dense rows: hk_linear up to caps.dense_max_rows rows, torch's GEMM above (prefill; fp32 where bf16 is emulated).
  quantized, "codebook" (NF4 / FP4): the codebook kernel (AVX-512 or AVX2 bodies) up to CODEBOOK_MAX_ROWS rows, else
      dequantized tiles and torch's GEMM.
  dense panels: the panel kernel up to DENSE_PANEL_MAX_ROWS rows (fma layout), then the panels widened to fp32 and
      torch's GEMM; the dot layout at every count, except from AMX_MIN_ROWS rows on AMX CPUs: row tiles unpacked from
      the panels and torch's bf16 GEMM.
"""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

import torch

from hearth import envs, kernels
from hearth.kernels import quant as qkernels
from hearth.kernels.decoder import PLAN_ROWS
from hearth.platform import cpu_info
from hearth.weights import activations
from hearth.weights.layouts import BY_NAME, TABLE, Layout

MAX_QUANT_ROWS = 128  # the quantized dot kernels' rows where the GEMM does not run; more: dequantized tiles + GEMM
GEMM_MAX_M = 64  # the quantized fp32-x GEMM's rows; more: dequantized tiles + torch's GEMM
BCAST_MIN_M = 32  # rows from which a step without prompt tokens takes the GEMM's broadcast form
CODEBOOK_MAX_ROWS = 32  # the codebook kernel's rows; more: dequantized (bf16) tiles + torch's GEMM
DENSE_PANEL_MAX_ROWS = 512  # the bf16 fma-panel GEMM's rows; more: widened weights + torch.mm
# Rows from which a dot-layout bf16 weight goes to torch's bf16 GEMM (row tiles unpacked from the panels) on CPUs
# with AMX tiles, which run it several times faster than vdpbf16ps. Above decoder.PLAN_ROWS: decode steps keep
# the panel kernel (and the decode program's plan table never names this kernel).
AMX_MIN_ROWS = 128


class Kernel(str, enum.Enum):
    DOT = "dot"  # hk_linear's dot kernels (float, int8, int8x2), by the weight's activation rounding
    GEMM = "gemm"  # hk_linear's GEMM: x in fp32, weights dequantized once per tile of rows
    BCAST = "bcast"  # hk_linear's GEMM in broadcast form
    PANELS = "panels"  # hk_linear on VNNI panels, int8 / int8x2 activations
    CODEBOOK = "codebook"  # hk_linear on a codebook weight: lookups in registers, fp32 x
    TILED = "tiled"  # dequantized row tiles + torch's GEMM (long prompts)
    REFERENCE = "reference"  # torch: the whole weight dequantized, F.linear (no kernels here)
    DENSE = "dense"  # hk_linear on rows as loaded (or their row blocks)
    DENSE_PANELS = "dense-panels"  # hk_linear on bf16 panels (bf16 out from pair panels)
    WIDEN = "widen"  # bf16 panels widened to fp32, torch's GEMM
    AMX_ROWS = "amx-rows"  # bf16 panels unpacked to row tiles, torch's bf16 GEMM (AMX tiles)
    TORCH = "torch"  # torch's F.linear (fp32 where the 16-bit GEMM would be emulated)


@dataclass(frozen=True, eq=False)
class Caps:
    """What this machine and the environment allow (eq=False: hashed by identity, so a plan cache is cheap)."""

    kernels: bool  # hearth's kernels compiled and runnable (AVX2 + FMA + F16C)
    avx512: bool
    vnni: bool  # AVX512-VNNI (vpdpbusd)
    gemm_mode: str  # HEARTH_QUANT_GEMM: "auto", "on", "off"
    quant_panels: bool  # HEARTH_QUANT_PANELS
    amx: bool = False  # AMX-BF16 tiles, which torch's bf16 GEMM (oneDNN) runs on

    @property
    def gemm(self) -> bool:
        """The quantized fp32-x GEMM runs here: AVX-512, unless HEARTH_QUANT_GEMM=0."""
        return self.gemm_mode != "off" and self.avx512

    @property
    def dense_max_rows(self) -> int:
        """Rows up to which hk_linear beats torch's GEMM on dense rows (wider vectors keep it ahead longer)."""
        return 64 if self.avx512 else 32


@functools.cache
def caps() -> Caps:
    """This process's capabilities, read once. Callers go through the module (dispatch.caps()), so a test can
    replace it."""
    return Caps(kernels=qkernels.available(), avx512=kernels.isa() == kernels.ISA_AVX512, vnni=cpu_info().has_vnni,
                gemm_mode=envs.quant_gemm(), quant_panels=envs.quant_panels(),
                amx=cpu_info().has_amx and torch.backends.mkldnn.is_available())


def gemm_from(layout: Layout, c: Caps) -> int:
    """Rows from which a quantized layout's kernel is the fp32-x GEMM (0: never)."""
    if not (layout.gemm and c.gemm):
        return 0
    if c.gemm_mode == "auto" and c.vnni:  # integer dots keep the few-row decode steps
        return BCAST_MIN_M
    return layout.gemm_from


def plan(layout: Layout, rows: int, c: Caps, prompt: bool = False) -> Kernel:
    """The kernel for `rows` rows of x against a weight in `layout`; prompt: the step carries prompt tokens
    (activations.prompt_rows), where the GEMM takes every row count so a row's numbers do not depend on the others."""
    if rows <= 0 or not c.kernels:
        return Kernel.REFERENCE if layout.quantized else Kernel.TORCH
    if layout.kernel == "panels":
        return Kernel.PANELS
    if layout.kernel == "dense":
        return Kernel.DENSE if rows <= c.dense_max_rows else Kernel.TORCH
    if layout.kernel == "codebook":
        return Kernel.CODEBOOK if rows <= CODEBOOK_MAX_ROWS else Kernel.TILED
    if layout.kernel == "dense-panels":
        if layout.name == "bf16-panels" and rows > DENSE_PANEL_MAX_ROWS:
            return Kernel.WIDEN
        if layout.name == "bf16-dot-panels" and c.amx and rows >= AMX_MIN_ROWS:
            return Kernel.AMX_ROWS
        return Kernel.DENSE_PANELS
    g = gemm_from(layout, c)
    if g and rows <= GEMM_MAX_M and (rows >= g or prompt):
        return Kernel.BCAST if rows >= BCAST_MIN_M and not prompt else Kernel.GEMM
    if rows <= (GEMM_MAX_M if g else MAX_QUANT_ROWS):
        return Kernel.DOT
    return Kernel.TILED


def panels_take(bits: int, group: int, k: int, c: Caps | None = None) -> bool:
    """Panels run here for weights of `bits` with scales per `group` along an input of k: int4 wherever the kernels
    run (AVX512-VNNI's body, or AVX2's vpmaddubsw one), int8 with AVX512-VNNI (on AVX2 the int8 row kernels are
    faster); HEARTH_QUANT_PANELS on and integer activations (the panel kernel has no float form)."""
    c = c or caps()
    isa = bits == 4 or (c.vnni and c.avx512)
    return (c.quant_panels and c.kernels and isa and activations.rounding() in ("int8", "int8x2")
            and bits in (4, 8) and group % 32 == 0 and k % 32 == 0)


def program_rows(c: Caps | None = None) -> int:
    """Rows up to which the whole-stack decode program takes a decode step of row-major weights (the dense kernel's
    rows: past them the layer path's torch GEMM is ahead)."""
    return (c or caps()).dense_max_rows


def program_prompt_rows(dense_layout: Layout, c: Caps | None = None) -> int | None:
    """Rows up to which the decode program takes a prompt step of a model whose dense weights are in dense_layout
    (None: every count): past them plan names a kernel the program does not have (AMX_ROWS)."""
    c = c or caps()
    return AMX_MIN_ROWS - 1 if plan(dense_layout, AMX_MIN_ROWS, c) is Kernel.AMX_ROWS else None


def program_plan(layout: Layout, c: Caps | None = None) -> list[str]:
    """plan's kernel names for a decode step of 1 .. decoder.PLAN_ROWS rows: what the decode program's descriptor of a
    weight in `layout` holds, so the program runs the kernel the layer path would at every row count."""
    c = c or caps()
    return [plan(layout, m, c).value for m in range(1, PLAN_ROWS + 1)]


def table(c: Caps | None = None, rows: tuple[int, ...] = (1, 8, 32, 128, 512)) -> list[tuple[str, str, list[str]]]:
    """(layout, what it is, kernel per row count in `rows`) for every layout: what `hearth doctor` prints."""
    c = c or caps()
    return [(lay.name, lay.doc, [plan(lay, m, c).value for m in rows]) for lay in TABLE]


def layout(name: str) -> Layout:
    return BY_NAME[name]
