"""Weight-only quantized linear: int8 (symmetric, per-channel or per-group scale) and int4 (per-group scale + min).

    from hearth.kernels import quant
    qw = quant.quantize_int4(w, group=64)          # or quantize_int8(w), or a GGUF repack (hearth.kernels.quant_gguf)
    y = quant.linear(x, qw, bias)                  # x [..., K] f32/bf16/f16 -> [..., N] in x's dtype

Layout (`QWeight`): int8 data [N, K] int8, or int4 data [N, K/2] uint8 where each 16-byte sub-block holds 32 weights
(low nibbles = elements 0..15, high nibbles = 16..31: GGUF Q4_0's order, so Q4_0/Q4_1 repack as a byte copy);
scales (and, int4, mins) fp32 [N, K/G], or fp16 for GGUF Q8_0/Q4_0/Q4_1 (their own scales, 2 bytes per block
instead of 4). Dequantized weight: int8 q * s; int4 q * s + min (q in 0..15), computed as one fma, which is
exactly what gguf.quants.dequantize gives for Q8_0, Q4_0, Q4_1, Q4_K and Q6_K (so prefill, and decode
with float activations, give the dequantized float model's results up to summation order).
int4 with 32-weight groups (GGUF Q4_0 / Q4_1 / Q4_K, int4-g32) is re-laid at load into 4-row tiles with the scales
inline (`tile_rows4`, QWeight.tiled; HEARTH_INT4_TILES=0 keeps plain rows): the same bytes, permuted so one decode
tile of four output rows reads one address range instead of eight streams. Results are bit-identical; TinyLlama
Q4_0 batch-1 decode was ~9% faster (4 alternated pairs, median tok/s).

Decode kernels (M <= MAX_KERNEL_M), three variants (ACTIVATIONS; HEARTH_QUANT_ACT=float|int8|int8x2, or auto: int8x2
with prompt rows in int8, see prompt_rows, and mostly-4-bit models in int8, see set_model_activations):
  "int8x2" (default) two-term int8 activations: per block of 32, d1 = amax / 127, q1 = round(x / d1), d2 = d1 / 254,
                    q2 = round((x - 254 d2 q1) / d2), so x ~ d2 * (254 q1 + q2) with error <= d2 / 2 = amax / 64516
                    (see quantize_activations_x2, bit-exact to the kernel). Two integer dot chains (maddubs + madd)
                    on the same unpacked weights, combined in int32 (254 p1 + p2, exact), one float fma per block.
                    vs fp32 x each output moves by at most sum_k |w_k| * amax(block of k) / 64516: on the bundled
                    SmolLM2 Q4_1 greedy tokens equal the dequantized model's (tests/e2e/test_quant_smollm2.py).
  "int8"            x is quantized once per call to int8 blocks of 32 (scale amax / 127, round half to even; see
                    quantize_activations), then integer dot products (AVX2 maddubs + madd, or AVX-512 VNNI vpdpbusd
                    where the CPU has it; on AVX-512 the M = 1 int4 / 6-bit tile kernels use 512-bit dots and int8
                    weights a vpmaddwd kernel on x widened to int16) and one float fma per block: llama.cpp's Q8
                    activation scheme. M > 1 int4-g32 / 6-bit tiles run the M = 1 kernels x row by x row. The result
                    is exactly dequantized weights x int8-rounded activations up to fp32 summation order; vs fp32 x
                    each output moves by at most sum_k |w_k| * amax(block of k) / 254.
  "float"           x stays fp32 and weights are dequantized in registers: the dequantized float model's results up
                    to summation order, but compute-bound at ~4 vector ops per weight.
Several rows on AVX-512 CPUs without VNNI (gemm_min_rows; HEARTH_QUANT_GEMM=0|1|auto): hq_linear_gemm keeps x in fp32
and dequantizes each weight vector in registers once per tile of up to 8 x rows, then plain fp32 FMAs (the dequantized
float model's results, like "float"). Without VNNI an integer dot costs about what an fp32 FMA does, so the int8
kernels pay that per weight per row; this pays it once per 8 rows. Qwen2.5-0.5B gate_up / down, 2 threads, vs
"int8x2" (paired, same process, time ratios): 8 rows int8 1.7-2.0x, Q8_0 1.9-2.0x, Q4_0 tiles 0.9-1.3x, int4-g128
0.85-1.2x; 16 rows 1.9-2.3x, 2.0x, 1.1-1.6x, 1.4-1.5x. Decode steps of BCAST_MIN_M+ rows take its broadcast form
(hq_linear_gemm_bcast: blocks dequantized once into fp32 panels, the bf16 panels' 6 x 64 tiles), 1.2-1.5x the dot
form's tiles at 32-64 rows. On VNNI CPUs (vpdpbusd: 64 multiply-adds per instruction) the integer kernels keep
decode steps of fewer than BCAST_MIN_M rows, and only the broadcast form (and prompt steps) take the GEMM: 2-vCPU Zen 5,
Qwen2.5-0.5B, per decode step, integer dots vs GEMM: 32 rows Q4_0 232 / 255 vs 159 / 159 ms; 8 rows Q4_0 70 / 70 vs
91 / 73, Q8_0 93 / 96 vs 95 / 83; prompt steps on a par (Q4_0 prefill 198 / 183 vs 191 / 192 tok/s).
Measured on the 2-core AVX2 Zen 3 VM with a CI run sharing it (1 thread, M = 1, alternated in one process, medians;
p10-p90 spread ~10-30%), per linear, float / int8 / int8x2: 2048x2048 (in cache) int4-g32 711 / 316 / 393 us, int8
360 / 156 / 251 us; 32000x2048 (DRAM) int4-g32 16.6 / 5.2 / 5.1 ms, int8 17.7 / 7.3 / 6.9 ms (int8x2 is as
memory-bound as int8 there). TinyLlama-shape Q4_0 decode step, process CPU ms, 1 thread: float 314, int8x2 138,
int8 132 (2.3x; ranges +-10-15%); 2 threads under heavy contention: 857 / 482 / 411 CPU ms.
Why not plain int8 everywhere: it moves logprobs ~3x as much as int8x2 (SmolLM2 Q4_1, fp32 activations as reference,
2386 teacher-forced tokens, mean top-20 KL: int8x2 6.7e-8 in an fp32 model; in the default bf16 model dtype int8x2
1.0e-3 vs the dtype's own 9.1e-4, int8 3.2e-3), and a decode step of a few rows is memory-bound, so two terms cost
nothing there. Prompts are compute-bound (int8x2's two vpdpbusd per multiply-add run at bf16's rate), so the
default (auto) rounds prompt rows to one term on VNNI panels: prefill ~1.4x faster; and on models of mostly 4-bit
weights, where the weights' rounding swamps int8's (set_model_activations), every row but the LM head's. Near ties
go either way under any rounding: SmolLM2 Q4_1 asked "What is the capital of France?" without a system turn starts
"The" -1.88 vs "L" -1.97 in fp32, an exact tie in bf16, and "L" derails ("L'Etoile, la Marseillaise, ...", as
llama.cpp answers).

On AVX512-VNNI CPUs quantized projections are re-laid at load into VNNI panels instead (to_panels, PANELS;
csrc/quant_panel.cpp): 64 columns x 4 k per 32-bit lane group, read by one broadcast-form vpdpbusd GEMM for every row
count with the ACTIVATIONS rounding above ("int8" / "int8x2"; "float" keeps the rows). Its per-row sums do not depend
on the other rows, so prompt_rows needs no special case. In-process, a Qwen2.5-0.5B-shaped stack of 24 layers, int8x2,
rows -> panels, ms per step: 1 row Q4_0 8.1 -> 6.9, Q8_0 16.1 -> 13.5; 8 rows Q4_0 39 -> 13, Q8_0 54 -> 16; 32 rows
Q4_0 89 -> 39; 128 rows Q4_0 300 -> 158. Prompt steps stay compute-bound: int8x2 takes two vpdpbusd per 4 multiply-
adds (~580 GOP/s on 2 Zen 5 cores, below the bf16 dot panels' ~700); "int8" takes one (~1200).

Why own kernels: torch's `_weight_int8pack_mm` / `_weight_int4pack_mm_for_cpu` on torch 2.13 (this 2-core AVX2
EPYC) take ~30-50 ms for a 2048x5632 weight at M=1 with fp32 x (a scalar path; ~1.2-1.5 ms with bf16 x, which
rounds activations to bf16) and ~350-450 ms at M=8.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hearth import envs, kernels
from hearth.kernels import _build
from hearth.platform import cpu_info

# Above this many tokens (prefill) the weight is dequantized in row tiles and multiplied by torch's fp32 GEMM.
# Measured on the 2-core AVX2 EPYC (shared, noisy; medians), W 2048x5632, 2 threads, kernel vs tiles+GEMM:
# int8 M=64 92 vs 208 ms, M=128 200 vs 248, M=256 399 vs 323; int4 g32 M=128 256 vs 240, M=256 453 vs 280.
MAX_KERNEL_M = 128
# Decode-shape kernel: "int8x2" (default) quantizes x per call to two int8 terms per block of 32 (error amax / 64516)
# and uses integer dot products; "int8" one term (llama.cpp's scheme, can flip near ties); "float" keeps x in fp32
# and dequantizes the weights in registers (exactly the dequantized float model up to summation order, ~2-3x slower).
# HEARTH_QUANT_ACT=float|int8|int8x2 selects one process-wide, see the module doc.
_ACT_SETTING = envs.quant_activations()
# The rounding of x for the integer kernels: "int8x2", "int8" or "float" (see the module doc).
ACTIVATIONS = "int8x2" if _ACT_SETTING == "auto" else _ACT_SETTING
# HEARTH_QUANT_ACT=auto (default): where ACTIVATIONS is int8x2, prompt rows on VNNI panels take single-term int8
# (llama.cpp's rounding) and generated tokens keep int8x2 (see prompt_rows); and a model whose quantized weights are
# mostly 4-bit takes single-term int8 for every row (see set_model_activations).
AUTO_ACTIVATIONS = _ACT_SETTING == "auto"
# hq_linear_gemm for several rows: "auto" on AVX-512 CPUs (with VNNI from BCAST_MIN_M rows and in prompt steps only),
# "1" from gemm_min_rows' few rows wherever AVX-512 runs, "0" never.
_GEMM_MODE = envs.quant_gemm()
# Where the GEMM runs, more rows take dequantized tiles + torch's fp32 GEMM (_tiled). Qwen2.5-0.5B gate_up / down,
# 2 threads: at 64 rows on a par (int8 24.1 vs 27.2 ms, Q4_0 26.1 vs 25.3), at 128 torch ahead (46 vs 42, 45 vs 31).
GEMM_MAX_M = 64
# Rows from which a step without prompt tokens takes the GEMM's broadcast form (hq_linear_gemm_bcast: weights
# dequantized once into fp32 panels per block, 6 x 64 broadcast tiles). Qwen2.5-0.5B gate_up, int8, 2 threads, vs the
# dot form: 16 rows 0.97x, 32 rows 1.2-1.3x, 64 rows 1.5x. Not in prompt steps (see prompt_rows).
BCAST_MIN_M = 32
# Set while a step that carries prompt tokens runs (prompt_rows): see linear.
_prompt = threading.local()
# Prefill of a bf16 model on a CPU with native bf16 GEMMs: dequantized tiles rounded to bf16 (<= 2^-9 relative, the
# rounding a bf16 model's activations carry anyway) and torch's bf16 GEMM (oneDNN, vdpbf16ps), not its fp32 one. 2-vCPU
# Zen 5, Qwen2.5-0.5B Q4_0, 8 x 128-token prompts: MKL's fp32 GEMM was 82% of the time at ~160 GF/s (its AMD code
# path), the bf16 GEMM runs at ~700. HEARTH_BF16_DOT=0 keeps fp32.
_BF16_PREFILL = cpu_info().has_native_bf16 and envs.bf16_dot()
# fp32 elements per dequantized tile in the prefill path (16 MiB).
_TILE_ELEMS = 4 << 20

_DTYPE_CODE = kernels._DTYPE_CODE


@dataclass
class QWeight:
    """A quantized [N, K] weight: see the module docstring for the layout."""

    bits: int  # 8 or 4
    group: int  # weights per scale along K (a multiple of 32 dividing K; K itself for per-channel int8; int8: 16)
    data: torch.Tensor  # int8 [N, K] | uint8 [N, K/2]
    scales: torch.Tensor  # fp32 [N, K/group], or fp16 (GGUF's own scales, see scale_f16)
    mins: torch.Tensor | None  # [N, K/group] like scales, int4 only; None for symmetric int4 (GGUF Q4_0): -8 scale
    # 4-row tiles (tile_rows4: int4 group 32; quant_gguf.repack_q6_tiles: bits 6, GGUF Q6_K): `data` holds the tiles
    # with the scales (and mins) inline, uint8 [N, the plain row's bytes]; `scales` (and `mins`, if any) are then
    # empty [N, 0] tensors that only carry the dtype.
    tiled: bool = False
    # VNNI panels (to_panels): `data` uint8 [ceil(N / 64), panel bytes], `scales` (and `mins`) [panels, K / group * 64];
    # panel_rows is N then (0: another layout).
    panel_rows: int = 0
    # The rounding of x its kernels take ("int8x2", "int8", "float"); None: the process-wide ACTIVATIONS. Set per
    # model at load (set_model_activations).
    activations: str | None = None

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

    @property
    def kernel_code(self) -> int:
        """The C kernels' weight-format argument: 0 int8, 1 int4, 2 / 3 int4 in 4-row tiles without / with mins,
        4 6-bit tiles (GGUF Q6_K, quant_gguf.repack_q6_tiles), 5 / 6 int8 / int4 in VNNI panels (to_panels)."""
        if self.panel_rows:
            return PANEL_CODES[0] if self.bits == 8 else PANEL_CODES[1]
        if self.bits == 6:
            return 4
        if self.tiled:
            return 3 if self.mins is not None else 2
        return int(self.bits == 4)

    def rows(self, start: int, size: int) -> QWeight:
        """Rows [start, start + size) (views; whole tiles of a tiled weight; copies for panels)."""
        if self.panel_rows:
            return from_panels(self).rows(start, size)
        if self.tiled:
            if start % 4 or size % 4:
                raise ValueError(f"rows({start}, {size}) of a 4-row-tiled weight must be whole tiles")
            return QWeight(self.bits, self.group, self.data.narrow(0, start, size), self.scales.narrow(0, start, size),
                           None if self.mins is None else self.mins.narrow(0, start, size), tiled=True)
        return QWeight(self.bits, self.group, self.data.narrow(0, start, size), self.scales.narrow(0, start, size),
                       None if self.mins is None else self.mins.narrow(0, start, size))

    def index_rows(self, index: torch.Tensor) -> QWeight:
        """Rows in `index` order (copies, plain layout): rows of block formats are independent, so a row permutation
        is exact."""
        if self.panel_rows:
            return from_panels(self).index_rows(index)
        if self.tiled:
            return untile_rows4(self).index_rows(index)
        return QWeight(self.bits, self.group, self.data[index], self.scales[index],
                       None if self.mins is None else self.mins[index])

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.data, self.scales, self.mins) if t is not None)


@functools.cache
def _lib() -> ctypes.CDLL | None:
    lib = _build.load()
    if lib is None or not hasattr(lib, "hq_linear"):
        return None
    i64, i32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    lib.hq_linear.argtypes = [ptr, i32, i64, i64, i64, ptr, i32, i64, i64, ptr, ptr, i64, i64, ptr, ptr, i32, i32, i32]
    lib.hq_linear.restype = i32
    lib.hq_linear_dot.argtypes = lib.hq_linear.argtypes
    lib.hq_linear_dot.restype = i32
    lib.hq_linear_dot2.argtypes = lib.hq_linear.argtypes
    lib.hq_linear_dot2.restype = i32
    lib.hq_linear_gemm.argtypes = lib.hq_linear.argtypes
    lib.hq_linear_gemm.restype = i32
    lib.hq_linear_gemm_bcast.argtypes = lib.hq_linear.argtypes
    lib.hq_linear_gemm_bcast.restype = i32
    lib.hq_linear_panels.argtypes = lib.hq_linear.argtypes
    lib.hq_linear_panels.restype = i32
    lib.hq_linear_panels2.argtypes = lib.hq_linear.argtypes
    lib.hq_linear_panels2.restype = i32
    lib.hq_linear_panels_out.argtypes = [ptr, i32, i64, i64, i64, ptr, i32, i64, ptr, ptr, i64, ptr, ptr, ptr, i32,
                                         i32, i32]
    lib.hq_linear_panels_out.restype = i32
    lib.hq_pack_panels.argtypes = [ptr, i32, i64, i64, i64, ptr, i32]
    lib.hq_pack_panels.restype = i32
    lib.hq_pack_panels_blocks.argtypes = [ptr, i32, i64, i64, i64, i64, i64, ptr, i32]
    lib.hq_pack_panels_blocks.restype = i32
    lib.hq_dequant.argtypes = [ptr, i32, i64, i64, ptr, ptr, i64, i64, i64, i64, ptr, i32, i32, i32]
    lib.hq_dequant.restype = i32
    lib.hq_dequant_gather.argtypes = [ptr, i32, i64, i64, ptr, ptr, i64, i64, i64, ptr, i64, ptr, i32, i32, i32]
    lib.hq_dequant_gather.restype = i32
    return lib


def available() -> bool:
    """True when the compiled quantized kernels run here; otherwise `linear` uses a (slow) torch reference."""
    return kernels.available() and _lib() is not None


def supports(k: int, group: int) -> bool:
    """Shapes the layout (and kernels) take: K a multiple of 32; the group a multiple of 32 dividing K, or 16 (int8
    only: GGUF Q6_K's sub-blocks)."""
    return k % 32 == 0 and (group == 16 or (group % 32 == 0 and group > 0 and k % group == 0))


# ---------------------------------------------------------------- quantize / dequantize (torch, load time)

def quantize_int8(w: torch.Tensor, group: int | None = None) -> QWeight:
    """Symmetric int8 (q in -127..127), per output channel (group None) or per group of `group` weights."""
    n, k = w.shape
    g = k if group is None else group
    wf = w.float().reshape(n, k // g, g)
    scales = wf.abs().amax(-1) / 127.0  # [N, K/g]
    inv = torch.where(scales > 0, 1.0 / scales, torch.zeros_like(scales))
    q = torch.round(wf * inv[..., None]).clamp_(-127, 127).to(torch.int8).reshape(n, k)
    return QWeight(8, g, q.contiguous(), scales.contiguous(), None)


def quantize_int4(w: torch.Tensor, group: int = 128) -> QWeight:
    """Asymmetric int4 per group: q = round((w - min) / s) in 0..15, s = (max - min) / 15."""
    n, k = w.shape
    wf = w.float().reshape(n, k // group, group)
    lo = wf.amin(-1).clamp(max=0.0)
    hi = wf.amax(-1).clamp(min=0.0)  # (0 stays exactly representable: zero padding rows dequantize to ~0)
    scales = (hi - lo) / 15.0
    inv = torch.where(scales > 0, 1.0 / scales, torch.zeros_like(scales))
    q = torch.round((wf - lo[..., None]) * inv[..., None]).clamp_(0, 15).to(torch.uint8).reshape(n, k)
    return QWeight(4, group, pack_u4(q), scales.contiguous(), lo.contiguous())


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


# ---------------------------------------------------------------- 4-row tiles (the decode layout of int4-g32)

# int4 weights with 32-weight groups are re-laid at load into 4-row tiles (HEARTH_INT4_TILES=0: keep the plain rows).
TILES = envs.int4_tiles()
# A GGUF Q6_K LM head is kept in 6-bit tiles (quant_gguf.repack_q6_tiles; HEARTH_Q6_TILES=0: int8, group 16).
Q6_TILES = envs.q6_tiles()


def can_tile(qw: QWeight) -> bool:
    """int4, 32-weight groups, K % 64 == 0 and N % 4 == 0 (the tile layout's domain), not tiled yet."""
    n, k = qw.shape
    return qw.bits == 4 and qw.group == 32 and not qw.tiled and k % 64 == 0 and n % 4 == 0 and n > 0


def tile_rows4(qw: QWeight) -> QWeight:
    """The same weight in 4-row tiles (exact, a byte permutation): rows 4t .. 4t + 3 become one run of records, each
    four pairs of blocks (256 weights; the last one K % 256 / 64 pairs) laid out as
        [scales: 4 rows x 8][mins: 4 rows x 8, if any][quants: 4 rows x 128 bytes]
    so a decode tile of four rows streams from one address range instead of eight (see quant.cpp, TileGeo)."""
    if not can_tile(qw):
        raise ValueError(f"tile_rows4 takes int4 group-32 weights with K % 64 == 0 and N % 4 == 0, got "
                         f"int{qw.bits} group {qw.group} shape {qw.shape}{' (tiled)' if qw.tiled else ''}")
    n, k = qw.shape
    t, npairs = n // 4, k // 64
    nq = npairs // 4
    parts = [qw.scales] + ([] if qw.mins is None else [qw.mins])
    # per tile, row, pair: the pair's bytes of each part
    views = [p.contiguous().view(torch.uint8).view(t, 4, npairs, -1) for p in parts]
    views.append(qw.data.contiguous().view(t, 4, npairs, 32))
    records = []
    for a, b, m in ((0, 4 * nq, nq), (4 * nq, npairs, 1)):  # the full records, then the last (if any)
        if b > a:
            # [t, 4, pairs, bytes] -> [t, records, 4 rows x pairs-of-record x bytes] per part, parts side by side
            cols = [v[:, :, a:b].reshape(t, 4, m, -1).permute(0, 2, 1, 3).reshape(t, m, -1) for v in views]
            records.append(torch.cat(cols, dim=2).reshape(t, -1))
    data = torch.cat(records, dim=1).reshape(n, -1).contiguous()
    empty = torch.empty(n, 0, dtype=qw.scales.dtype)
    return QWeight(4, 32, data, empty, None if qw.mins is None else torch.empty(n, 0, dtype=qw.scales.dtype),
                   tiled=True)


def untile_rows4(qw: QWeight) -> QWeight:
    """Inverse of tile_rows4: the plain layout (copies). 6-bit tiles become int8 with 16-weight groups."""
    if not qw.tiled:
        return qw
    if qw.bits == 6:
        return _untile_q6(qw)
    n, k = qw.shape
    t, npairs = n // 4, k // 64
    nq = npairs // 4
    sdt = qw.scales.dtype
    ssz = qw.scales.element_size()
    sizes = [2 * ssz] * (1 if qw.mins is None else 2) + [32]  # bytes per pair of each part
    flat = qw.data.reshape(t, -1)
    pieces: list[list[torch.Tensor]] = [[] for _ in sizes]
    off = 0
    for a, b, m in ((0, 4 * nq, nq), (4 * nq, npairs, 1)):  # as tile_rows4
        if b > a:
            per = (b - a) // m  # pairs per record
            rec = flat[:, off:off + m * 4 * per * sum(sizes)].reshape(t, m, -1)
            off += m * 4 * per * sum(sizes)
            c = 0
            for i, sz in enumerate(sizes):
                part = rec[:, :, c:c + 4 * per * sz].reshape(t, m, 4, per * sz).permute(0, 2, 1, 3)
                pieces[i].append(part.reshape(t, 4, (b - a) * sz))
                c += 4 * per * sz
    cols = [torch.cat(p, dim=2).reshape(n, -1).contiguous() for p in pieces]
    scales = cols[0].view(sdt)
    mins = cols[1].view(sdt) if qw.mins is not None else None
    return QWeight(4, 32, cols[-1], scales, mins)


def _untile_q6(qw: QWeight) -> QWeight:
    """6-bit tiles (quant_gguf.repack_q6_tiles: GGUF Q6_K blocks, 4 rows interleaved) -> int8 q = value - 32, fp32
    scales d * sc per 16 weights (exact): the rows put back in order, then the file's own Q6_K decode."""
    from hearth.kernels.quant_gguf import q6k_to_int8  # (quant_gguf imports this module)

    n, k = qw.shape
    nsb = k // 256
    rec = qw.data.reshape(n // 4, nsb, 4, 210).permute(0, 2, 1, 3).reshape(n, nsb, 210)
    return q6k_to_int8(rec.numpy(), n, k)


# ---------------------------------------------------------------- VNNI panels (several rows on AVX512-VNNI CPUs)

# Quantized projections are re-laid at load into 64-column panels read by vpdpbusd in broadcast form
# (csrc/quant_panel.cpp) on CPUs with AVX512-VNNI: one kernel for every row count (HEARTH_QUANT_PANELS=0: keep rows).
PANELS = envs.quant_panels()
PANEL_COLS = 64
PANEL_CODES = (5, 6)  # QWeight.kernel_code of int8 / int4 panels (csrc/hk_api.h kPanelsInt8 / kPanelsInt4)


def can_panel(qw: QWeight) -> bool:
    """int8 or int4 in plain rows or 4-row tiles, groups of 32 or more (not GGUF Q6_K's 16), on a CPU with AVX512-VNNI
    where the kernels run and activations are quantized (HEARTH_QUANT_ACT int8 / int8x2)."""
    return not qw.panel_rows and qw.shape[0] > 0 and panels_take(qw.bits, qw.group, qw.shape[1])


def panels_take(bits: int, group: int, k: int) -> bool:
    """VNNI panels run here for weights of `bits` with scales per `group` along an input of k (see can_panel)."""
    return (PANELS and available() and cpu_info().has_vnni and kernels.isa() == kernels.ISA_AVX512
            and ACTIVATIONS in ("int8", "int8x2") and bits in (4, 8) and group % 32 == 0 and k % 32 == 0)


def to_panels(qw: QWeight, chunk: int = 64, kernel: bool = True) -> QWeight:
    """The weight in VNNI panels (csrc/quant_panel.cpp's layout; exact: from_panels gives the rows back): by the
    kernel library's packer (hq_pack_panels), or (kernel=False, or no VNNI) in torch, `chunk` panels at a time into
    the result, so a big table (a tied head's) needs little memory beyond it. Same bytes either way."""
    qw = untile_rows4(qw)
    n, k = qw.shape
    p = -(-n // PANEL_COLS)
    per_panel = PANEL_COLS * k // (1 if qw.bits == 8 else 2)
    data = torch.empty(p, per_panel, dtype=torch.uint8)
    src = qw.data if qw.data.stride(1) == 1 else qw.data.contiguous()
    packed = kernel and available() and _lib().hq_pack_panels(
        src.data_ptr(), qw.bits, n, k, src.stride(0), data.data_ptr(), torch.get_num_threads()) == 0
    for p0 in range(0, 0 if packed else p, chunk):  # (the torch form: no VNNI kernels here; the tests' reference)
        p1 = min(p, p0 + chunk)
        rows = qw.data[p0 * PANEL_COLS:min(n, p1 * PANEL_COLS)]
        u = rows.view(torch.uint8) ^ 0x80 if qw.bits == 8 else unpack_u4(rows)  # int8: q + 128 (mod 256)
        u = F.pad(u, (0, 0, 0, (p1 - p0) * PANEL_COLS - u.shape[0]))
        u = u.reshape(p1 - p0, PANEL_COLS, k // 4, 4).permute(0, 2, 1, 3)  # [panels, K/4, 64, 4]
        if qw.bits == 4:  # columns 32v + i (low nibble) and 32v + 16 + i (high) share byte (v, i)
            u = u.reshape(p1 - p0, k // 4, 2, 2, 16, 4)
            u = u[:, :, :, 0] | (u[:, :, :, 1] << 4)
        data[p0:p1] = u.reshape(p1 - p0, -1)
    return QWeight(qw.bits, qw.group, data, panel_scales(qw.scales), panel_scales(qw.mins), panel_rows=n)


def panel_scales(s: torch.Tensor | None) -> torch.Tensor | None:
    """Per-row scales (or mins) [N, K / group] -> the panels' [ceil(N / 64), K / group * 64] (rows past N: zero)."""
    if s is None:
        return None
    p = -(-s.shape[0] // PANEL_COLS)
    return (F.pad(s, (0, 0, 0, p * PANEL_COLS - s.shape[0])).reshape(p, PANEL_COLS, -1).transpose(1, 2)
            .reshape(p, -1).contiguous())


def from_panels(qw: QWeight) -> QWeight:
    """Inverse of to_panels: the plain rows."""
    if not qw.panel_rows:
        return qw
    n, k = qw.shape
    p = qw.data.shape[0]
    if qw.bits == 8:
        u = qw.data.reshape(p, k // 4, PANEL_COLS, 4)
    else:
        b = qw.data.reshape(p, k // 4, 2, 1, 16, 4)
        u = torch.cat([b & 0x0F, b >> 4], dim=3).reshape(p, k // 4, PANEL_COLS, 4)
    rows = u.permute(0, 2, 1, 3).reshape(p * PANEL_COLS, k)[:n]
    data = (rows.to(torch.int16) - 128).to(torch.int8) if qw.bits == 8 else pack_u4(rows.contiguous())

    def per_row(s: torch.Tensor | None) -> torch.Tensor | None:
        if s is None:
            return None
        return s.reshape(p, -1, PANEL_COLS).transpose(1, 2).reshape(p * PANEL_COLS, -1)[:n].contiguous()

    return QWeight(qw.bits, qw.group, data.contiguous(), per_row(qw.scales), per_row(qw.mins))


def _gather_panels(qw: QWeight, ids: torch.Tensor) -> torch.Tensor:
    """dequantize(qw)[ids] read from the panels (a tied head's table: token lookups), without unpacking the table."""
    n, k = qw.shape
    ids = ids.to(torch.int64).reshape(-1)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n):
        raise IndexError(f"token id out of range for an embedding table of {n} rows")
    p, c = ids // PANEL_COLS, ids % PANEL_COLS
    panels = qw.data.shape[0]
    if qw.bits == 8:
        q = qw.data.view(panels, k // 4, PANEL_COLS, 4)[p, :, c, :].reshape(-1, k).to(torch.int16) - 128
    else:  # byte (v, i) of a quad: column 32v + i low nibble, 32v + 16 + i high
        b = qw.data.view(panels, k // 4, 2, 16, 4)[p, :, c // 32, c % 16, :].reshape(-1, k)
        q = (b >> (4 * ((c % 32) // 16)).to(torch.uint8)[:, None]) & 0x0F
    g = qw.group
    ng = k // g

    def pick(t: torch.Tensor) -> torch.Tensor:
        return t.view(panels, ng, PANEL_COLS)[p, :, c].float()[..., None]

    s = pick(qw.scales)
    if qw.bits == 8:
        return (q.float().reshape(-1, ng, g) * s).reshape(-1, k)
    mins = pick(qw.mins) if qw.mins is not None else -8.0 * s
    return torch.addcmul(mins, q.float().reshape(-1, ng, g), s).reshape(-1, k)


def dequantize(qw: QWeight) -> torch.Tensor:
    """Reference dequantization (torch): fp32 [N, K], the same floats the kernels compute in registers."""
    qw = from_panels(qw)
    if qw.tiled:
        qw = untile_rows4(qw)
    n, k = qw.shape
    g = qw.group
    s = qw.scales.float()[..., None]
    if qw.bits == 8:
        return (qw.data.float().reshape(n, k // g, g) * s).reshape(n, k)
    q = unpack_u4(qw.data).float().reshape(n, k // g, g)
    return torch.addcmul(implied_mins(qw)[..., None], q, s).reshape(n, k)  # q * s + min, like the kernel's fma


def implied_mins(qw: QWeight) -> torch.Tensor:
    """int4 mins, stored or (symmetric int4) -8 * scales; exact in fp32 either way."""
    qw = from_panels(qw)
    if qw.tiled:
        qw = untile_rows4(qw)
    return qw.mins.float() if qw.mins is not None else -8.0 * qw.scales.float()


# ---------------------------------------------------------------- matmul

def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _isa(isa_code: int | None) -> int:
    return isa_code or kernels.isa()


def gemm_enabled() -> bool:
    """Whether hq_linear_gemm runs for several rows here: AVX-512, unless HEARTH_QUANT_GEMM=0."""
    return _GEMM_MODE != "off" and kernels.isa() == kernels.ISA_AVX512


def _vnni_keeps_few_rows() -> bool:
    """Whether decode steps of fewer than BCAST_MIN_M rows keep the integer kernels (VNNI, HEARTH_QUANT_GEMM auto)."""
    return _GEMM_MODE == "auto" and cpu_info().has_vnni


def gemm_min_rows(qw: QWeight) -> int:
    """Rows of x from which this weight's kernel is hq_linear_gemm (0: never; see the module doc). Paired with the
    int8x2 kernels on the 2-vCPU Skylake-SP: int8 weights ahead from 4 rows, int4 from 8 (0.8-0.9x at 4, ~1.0x at 6).
    Not for the 6-bit tiles or int8 with 16-weight groups (GGUF Q6_K's layouts)."""
    if not gemm_enabled() or qw.bits == 6 or qw.group == 16 or qw.panel_rows:
        return 0
    if _vnni_keeps_few_rows():
        return BCAST_MIN_M
    return 4 if qw.bits == 8 else 8


def _run(x: torch.Tensor, qw: QWeight, bias: torch.Tensor | None, isa_code: int | None = None,
         act: str | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """The C++ kernel on x [M, K] -> fp32 [M, N] (into out, contiguous, if given); act "float", "int8", "int8x2",
    "gemm" or "bcast" (the GEMM's broadcast form) (default: ACTIVATIONS), see the module doc."""
    m, k = x.shape
    n = qw.shape[0]
    if x.stride(1) != 1 or (m > 1 and x.stride(0) < k):
        x = x.contiguous()
    out = torch.empty(m, n, dtype=torch.float32) if out is None else out
    act = act or qw.activations or ACTIVATIONS
    fn = {"int8": _lib().hq_linear_dot, "int8x2": _lib().hq_linear_dot2, "float": _lib().hq_linear,
          "gemm": _lib().hq_linear_gemm, "bcast": _lib().hq_linear_gemm_bcast,
          "panels": _lib().hq_linear_panels, "panels2": _lib().hq_linear_panels2}[act]
    rc = fn(x.data_ptr(), _DTYPE_CODE[x.dtype], m, k, x.stride(0), qw.data.data_ptr(),
                          qw.kernel_code, n, qw.data.stride(0), qw.scales.data_ptr(), _ptr(qw.mins),
                          qw.scales.stride(0), qw.group, _ptr(bias), out.data_ptr(), _isa(isa_code),
                          torch.get_num_threads(), int(qw.scale_f16))
    if rc != 0:
        raise RuntimeError(f"hq_linear failed with code {rc}")
    return out


def _panels(x: torch.Tensor, qw: QWeight, bias: torch.Tensor | None, split: int, bf16: bool) -> torch.Tensor:
    """x [M, K] on VNNI panels -> fp32 [M, N], or with bf16 the result rounded to bf16 in the kernel (the fp32
    result's .to(torch.bfloat16), without an fp32 output pass): rows [0, split) with int8x2 activations, the rest
    single-term int8 (see _int8_from)."""
    x = x.contiguous()
    (m, k), n = x.shape, qw.shape[0]
    f32 = torch.empty(m, n, dtype=torch.float32)  # the result, or (bf16) the sums of K blocks before the last
    out = torch.empty(m, n, dtype=torch.bfloat16) if bf16 else None
    for r0, r1, x2 in ((0, split, 1), (split, m, 0)):
        if r1 > r0:
            rc = _lib().hq_linear_panels_out(x[r0].data_ptr(), _DTYPE_CODE[x.dtype], r1 - r0, k, k,
                                             qw.data.data_ptr(), qw.kernel_code, n, qw.scales.data_ptr(),
                                             _ptr(qw.mins), qw.group, _ptr(bias), f32[r0].data_ptr(),
                                             _ptr(out[r0] if bf16 else None), torch.get_num_threads(),
                                             int(qw.scale_f16), x2)
            if rc != 0:
                raise RuntimeError(f"hq_linear_panels_out failed with code {rc}")
    return out if bf16 else f32


def quantize_activations(x: torch.Tensor) -> torch.Tensor:
    """Reference of the int8 activation rounding of the "int8" kernels: x [M, K] fp32 -> the dequantized floats
    dx * qx per block of 32 (dx = amax / 127, qx = round-half-even(x / dx)), bit-identical to the kernel's qx, dx."""
    m, k = x.shape
    xb = x.float().reshape(m, k // 32, 32)
    d = xb.abs().amax(-1, keepdim=True) / 127.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    return (torch.round(xb * inv) * d).reshape(m, k)


def quantize_activations_x2(x: torch.Tensor) -> torch.Tensor:
    """Reference of the two-term activations of the "int8x2" kernels: x [M, K] fp32 -> d2 * (254 * q1 + q2) per block
    of 32, bit-identical to the kernel's q1, q2, d2: d1 = amax / 127, q1 = round-half-even(x * fl(1 / d1)),
    d2 = fl(d1 / 254), r = fl(x - d2 * (254 * q1)) (one rounding: the kernel's fma), q2 = clamp(round-half-even(
    r * fl(1 / d2)), -127, 127). |x - result| <= d2 / 2 (+ fp32 rounding) = amax / 64516."""
    m, k = x.shape
    xb = x.float().reshape(m, k // 32, 32)
    d1 = xb.abs().amax(-1, keepdim=True) / 127.0
    inv1 = torch.where(d1 > 0, 1.0 / d1, torch.zeros_like(d1))
    q1 = torch.round(xb * inv1)
    d2 = d1 / 254.0
    inv2 = torch.where(d2 > 0, 1.0 / d2, torch.zeros_like(d2))
    hi = q1 * 254.0  # exact integers
    r = (xb.double() - d2.double() * hi.double()).float()  # exact in double, so one rounding like the fma
    q2 = torch.round(r * inv2).clamp_(-127, 127)
    return ((hi + q2) * d2).reshape(m, k)


def dequantize_rows(qw: QWeight, start: int, end: int, isa_code: int | None = None) -> torch.Tensor:
    """Rows [start, end) of the dequantized weight, fp32, by the kernel library (the torch reference without it)."""
    if not available() or qw.panel_rows:
        return dequantize(untile_rows4(qw).rows(start, end - start))
    k = qw.shape[1]
    out = torch.empty(end - start, k, dtype=torch.float32)
    rc = _lib().hq_dequant(qw.data.data_ptr(), qw.kernel_code, k, qw.data.stride(0), qw.scales.data_ptr(),
                           _ptr(qw.mins), qw.scales.stride(0), qw.group, start, end, out.data_ptr(),
                           _isa(isa_code), torch.get_num_threads(), int(qw.scale_f16))
    if rc != 0:
        raise RuntimeError(f"hq_dequant failed with code {rc}")
    return out


def dequantize_gather(qw: QWeight, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` (int64 [n]) of the dequantized weight, fp32 [n, K]: an embedding lookup. IndexError for an id
    outside the table, as F.embedding."""
    n_rows, k = qw.shape
    if qw.panel_rows:
        return _gather_panels(qw, ids)
    if not available():
        return dequantize(qw.index_rows(ids))
    ids = ids.to(torch.int64).contiguous()
    out = torch.empty(ids.numel(), k, dtype=torch.float32)
    rc = _lib().hq_dequant_gather(qw.data.data_ptr(), qw.kernel_code, k, qw.data.stride(0), qw.scales.data_ptr(),
                                  _ptr(qw.mins), qw.scales.stride(0), qw.group, n_rows, ids.data_ptr(), ids.numel(),
                                  out.data_ptr(), _isa(None), torch.get_num_threads(), int(qw.scale_f16))
    if rc == -4:
        raise IndexError(f"token id out of range for an embedding table of {n_rows} rows")
    if rc != 0:
        raise RuntimeError(f"hq_dequant_gather failed with code {rc}")
    return out


def _tiled(x: torch.Tensor, qw: QWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """Prefill: dequantize row tiles (bounded memory) and use torch's GEMM on each: fp32, or for bf16 activations where
    bf16 GEMMs are native (_BF16_PREFILL) the tiles rounded to bf16 and torch's bf16 GEMM."""
    n, k = qw.shape
    bf16 = x.dtype == torch.bfloat16 and _BF16_PREFILL
    xs = x if bf16 else x.float()
    out = torch.empty(x.shape[0], n, dtype=torch.float32)
    tile = max(16, _TILE_ELEMS // k)
    for n0 in range(0, n, tile):
        n1 = min(n, n0 + tile)
        w = dequantize_rows(qw, n0, n1)
        out[:, n0:n1] = torch.mm(xs, (w.to(torch.bfloat16) if bf16 else w).t())
    if bias is not None:
        out += bias
    return out


@contextlib.contextmanager
def prompt_rows(generated: int = 0, total: int | None = None):
    """Mark a forward pass that carries prompt tokens: where the GEMM runs (gemm_min_rows > 0), its rows take it
    whatever their count (up to GEMM_MAX_M). A prompt's last token recomputed alone after a prefix-cache hit then gets
    exactly the numbers it had inside its full prefill (the GEMM's per-row sums do not depend on the other rows), so a
    repeated seeded request samples the same tokens.

    The step's first `generated` of its `total` rows (None: any count) are generated tokens (decodes, speculative
    verification); with AUTO_ACTIVATIONS the others, prompt rows, take single-term int8 activations on int8x2 VNNI
    panels: prompts are the compute-bound part, where int8x2's two vpdpbusd per multiply-add cost as much as bf16
    (prefill ~1.4x faster with one), and each row's rounding depends only on whether it is a prompt token, not on what
    runs beside it. Linears whose row count is not `total` (MoE experts' token subsets) keep int8x2 for every row."""
    prev = getattr(_prompt, "on", False), getattr(_prompt, "generated", 0), getattr(_prompt, "total", None)
    _prompt.on, _prompt.generated, _prompt.total = True, generated, total
    try:
        yield
    finally:
        _prompt.on, _prompt.generated, _prompt.total = prev


def _int8_from(m: int, activations: str | None = None) -> int:
    """Rows [0, result) of an m-row panel call in int8x2, the rest in single-term int8 (see prompt_rows); weights
    whose `activations` set_model_activations made "int8x2" (a model too small for one term) keep every row."""
    if activations == "int8x2" or not (AUTO_ACTIVATIONS and ACTIVATIONS == "int8x2" and getattr(_prompt, "on", False)):
        return m
    total = _prompt.total
    return min(m, _prompt.generated) if total is None or total == m else m


# One int8 term for a whole model only from this many quantized weights (outside the LM head): see one_term_pays.
ONE_TERM_MIN_WEIGHTS = 200_000_000


def one_term_pays(weights: int) -> bool:
    """Whether a mostly-4-bit model of `weights` quantized weights takes one int8 term for every row (auto).

    Decided by measurement, not by bit width alone: in a model this small a decode step is mostly per-layer overhead
    (attention, norms, the head), so halving the integer dots buys little, while its logits are the least averaged
    and near ties flip. SmolLM2-135M Q4_1 (106M weights) with one term answers "What is the capital of France?"
    (no system turn, greedy) "L'Etoile, ..." where its fp32 reference answers Paris, and leaves the reference's greedy
    tokens on 16 of 28 chat prompts (tests/e2e/test_default_answers.py); with int8x2 on none. Qwen2.5-0.5B (358M)
    keeps one term: there it is the 1.25x of 32 sequences in flight."""
    return weights >= ONE_TERM_MIN_WEIGHTS


def set_model_activations(qweights: Iterable[QWeight], head: QWeight | None = None) -> str | None:
    """HEARTH_QUANT_ACT=auto: a model whose quantized weights are mostly 4-bit (by count) rounds x to single-term int8
    for every row of every quantized linear (each QWeight.activations = "int8") but its LM head `head`; returns
    "int8", or None where ACTIVATIONS stays (models mostly of 8-bit or 6-bit weights, or another setting). A model
    too small for one term (one_term_pays) takes int8x2 for every row of every linear, prompt rows and head
    included (each QWeight.activations = "int8x2"; returns "int8x2").

    Why: there int8's rounding of x is lost in the 4-bit rounding of the weights. SmolLM2 Q4_1, fp32 reference, 2386
    teacher-forced tokens, mean top-20 KL: every weight moved by a uniform error of one 4-bit step (what rounding to
    Q4 loses) 0.21, of one Q8_0 step 1.6e-3; int8 activations 2.4e-3 (~1% of the 4-bit rounding's), int8x2 3e-5.
    It is llama.cpp's rounding on its Q4 formats, and halves the integer work of decode steps of many rows
    (Qwen2.5-0.5B Q4_0, 32 in flight: ~1.25x output tok/s). Per model, not per step: a sequence's tokens do not
    depend on what runs beside it. The head keeps ACTIVATIONS: its outputs are the logits themselves, where a near
    tie decides a greedy token (SmolLM2 Q4_1 in bf16, asked "What is the capital of France?" after a system turn,
    answers "The capital of France is Paris." with an int8x2 head and "La femme de France, ..." with one term)."""
    unique = [q for q in {id(q): q for q in qweights}.values() if q is not head]
    total = sum(q.shape[0] * q.shape[1] for q in unique)
    four = sum(q.shape[0] * q.shape[1] for q in unique if q.bits == 4)
    if not (AUTO_ACTIVATIONS and ACTIVATIONS == "int8x2"):
        return None
    if not one_term_pays(total):  # two terms for every row, prompt rows and the head's included (see _int8_from)
        for q in unique + ([head] if head is not None else []):
            q.activations = "int8x2"
        return "int8x2"
    if 2 * four <= total:
        return None
    for q in unique:
        q.activations = "int8"
    return "int8"


def linear(x: torch.Tensor, qw: QWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x deq(W)^T + b (x [..., K]); output in x's dtype, fp32 accumulate.

    Few tokens: the C++ kernels; from gemm_min_rows(qw) rows (or in prompt_rows) up to GEMM_MAX_M the fp32-x GEMM
    (from BCAST_MIN_M rows outside prompt_rows in broadcast form), below that the integer-dot kernels (ACTIVATIONS;
    up to MAX_KERNEL_M where the GEMM does not run). More tokens: row tiles dequantized to fp32 and torch's GEMM.
    Without the kernels: the torch reference (dequantize, F.linear).
    """
    k = x.shape[-1]
    m = x.numel() // k if k else 0
    b = None if bias is None else bias.float().contiguous()
    x2 = x.reshape(m, k)
    if qw.panel_rows and m > 0:  # (can_panel: the kernels run here)
        act = qw.activations or ACTIVATIONS  # (ACTIVATIONS per call)
        if act == "float":  # (only if it changed after the load: can_panel keeps float weights in rows)
            raise RuntimeError("quantized weights were re-laid into VNNI panels at load, which take int8 / int8x2 "
                               "activations: set HEARTH_QUANT_ACT=float (or HEARTH_QUANT_PANELS=0) before loading")
        split = _int8_from(m, qw.activations) if act == "int8x2" else 0
        y = _panels(x2, qw, b, split, bf16=x2.dtype == torch.bfloat16)
        return y.reshape(*x.shape[:-1], qw.shape[0]).to(x.dtype)
    rows = gemm_min_rows(qw) if available() and x.dtype in _DTYPE_CODE else 0
    prompt = getattr(_prompt, "on", False)
    if rows and 0 < m <= GEMM_MAX_M and (m >= rows or prompt):
        y = _run(x2, qw, b, act="bcast" if m >= BCAST_MIN_M and not prompt else "gemm")
    elif available() and x.dtype in _DTYPE_CODE and 0 < m <= (rows and GEMM_MAX_M or MAX_KERNEL_M):
        y = _run(x2, qw, b)
    elif available() and m > 0:
        y = _tiled(x2, qw, b)
    else:
        y = F.linear(x2.float(), dequantize(qw), b)
    return y.reshape(*x.shape[:-1], qw.shape[0]).to(x.dtype)
