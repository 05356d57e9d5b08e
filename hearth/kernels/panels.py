"""bf16 weights in 32-row panels, read by hearth's own GEMMs: csrc/panel.cpp (fp32 FMAs, AVX-512 CPUs without
native bf16: the "fma" layout) or csrc/panel_dot.cpp (vdpbf16ps dot products, AVX512-BF16 CPUs: the "dot" layout).

    if panels.supported():
        w_panel = panels.pack(w, out)   # w [N, K] bf16 -> [ceil(N/32), K, 32] bf16 (a view of out)
    y = hearth.weights.apply.dense_panels_linear(x, [w_panel], [N], bias)   # = F.linear(x, w, bias)

Why: a decode step with several sequences multiplies a few x rows by every weight. On row-major weights the kernel
computes dot products (one conversion per 4 FMAs, horizontal sums at the end); in panels it broadcasts x values into
FMAs against 32 outputs' weights at once, reading each thread's weights as one sequential stream. Long prefills on
the fma layout widen the panels into an fp32 [K, N] scratch for torch's GEMM (hearth.weights.dispatch decides when).
HEARTH_PANELS=0 keeps row-major weights.

The dot layout (AVX512-BF16 CPUs, bf16 models: x must be bf16 already, as the kernel rounds it to bf16) holds the
same bytes in another order: at each k pair, 32-bit lane j holds row j's (w[2kp], w[2kp + 1]), so one vdpbf16ps
multiplies a broadcast x pair into 16 outputs. Without AMX it keeps up with torch's bf16 GEMM even at prompt sizes,
so every row count runs it; on CPUs with AMX tiles, long prompts take torch's bf16 GEMM on row tiles unpacked from
the panels (dot_rows; hearth.weights.dispatch decides when).
"""
from __future__ import annotations

import ctypes
import functools

import torch

from hearth import envs, kernels
from hearth.kernels import _build

ROWS = 32  # outputs per panel


@functools.cache
def _lib() -> ctypes.CDLL | None:
    return _build.load()


@functools.cache
def _cpu_layout() -> str | None:
    """The layout this CPU's panel kernels read (what pack() writes): "dot" (AVX512-BF16), "fma" (AVX-512 without
    native bf16 GEMMs), None (no AVX-512 or no kernels)."""
    from hearth.platform import cpu_info

    if kernels.isa() != kernels.ISA_AVX512 or _lib() is None:
        return None
    if cpu_info().has_avx512_bf16:
        return "dot"
    return None if cpu_info().has_native_bf16 else "fma"


def layout() -> str | None:
    """The panel layout a model loaded now gets: the CPU's (see _cpu_layout), or None when HEARTH_PANELS=0, or for
    the dot layout when HEARTH_BF16_DOT=0 (no vdpbf16ps anywhere: row-major weights, fp32-FMA kernel)."""
    found = _cpu_layout()
    if not envs.panels_enabled() or (found == "dot" and not envs.bf16_dot()):
        return None
    return found


def supported(compute_dtype: torch.dtype = torch.bfloat16) -> bool:
    """True where packing pays and the kernels run for a model computing in compute_dtype (see layout()); the dot
    layout rounds x to bf16, so it takes bf16 models only."""
    found = layout()
    return found == "fma" or (found == "dot" and compute_dtype == torch.bfloat16)


def dtype_code() -> int:
    """The dense format code (hk_weight's `format`) of this machine's panel weights."""
    return kernels.BF16_DOT_PANELS if _cpu_layout() == "dot" else kernels.BF16_PANELS


def packable(n: int, k: int) -> bool:
    """Whether an [n, k] weight fits this machine's layout (the dot layout pairs k values: k even)."""
    return n > 0 and k > 0 and (_cpu_layout() != "dot" or k % 2 == 0)


def lane(i: torch.Tensor) -> torch.Tensor:
    """fma layout: where row i (0..31) of a panel sits among the 32 values of one k (rows i and 16 + i share a
    32-bit lane)."""
    return (i % 16) * 2 + i // 16


def gather_rows(p: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows ids (1-D) of the weight whose panels are p ([ceil(N/32), K, 32], as pack() returns them): [len, K]."""
    if _cpu_layout() != "dot":
        return p[ids // ROWS, :, lane(ids % ROWS)]
    k = p.shape[1]
    pairs = p.view(p.shape[0], k // 2, 2, 16, 2)  # [panel][k pair][half][lane][2]
    i = ids % ROWS
    return pairs[ids // ROWS, :, i // 16, i % 16, :].reshape(len(ids), k)


def numel(n: int, k: int) -> int:
    """bf16 elements of an [n, k] weight's panels."""
    return -(-n // ROWS) * k * ROWS


def pack(w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """w [N, K] bf16 (unit stride along K) into out (>= numel(N, K) bf16 elements, contiguous); returns the view
    [ceil(N/32), K, 32] of out that holds the panels."""
    n, k = w.shape
    if w.dtype != torch.bfloat16 or w.stride(1) != 1 or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError("panels.pack takes a bf16 [N, K] weight with unit stride along K and a contiguous bf16 out")
    size = numel(n, k)
    if out.numel() < size:
        raise ValueError(f"panels.pack: out has {out.numel()} elements, needs {size}")
    if _cpu_layout() == "dot":
        if _lib().hk_pack_dot_panels(w.data_ptr(), n, k, w.stride(0), out.data_ptr(), torch.get_num_threads()):
            raise ValueError(f"panels.pack: the dot layout needs AVX512-BF16 and an even K (got {k})")
    else:
        _lib().hk_pack_panels(w.data_ptr(), n, k, w.stride(0), out.data_ptr(), torch.get_num_threads())
    return out[:size].view(-1, k, ROWS)


def place(w: torch.Tensor, out: torch.Tensor, pack_now: bool = True) -> torch.Tensor:
    """w's panels in out, as pack() returns them: packed from w, or (pack_now=False) already there, e.g. read
    from a cache file written by an earlier run."""
    return pack(w, out) if pack_now else out[:numel(*w.shape)].view(-1, w.shape[1], ROWS)


def _pointers(panels: list[torch.Tensor], rows: list[int]) -> tuple[ctypes.Array, ctypes.Array]:
    return (ctypes.c_void_p * len(panels))(*[p.data_ptr() for p in panels]), (ctypes.c_int64 * len(rows))(*rows)


def widen(panels: list[torch.Tensor], rows: list[int]) -> torch.Tensor:
    """cat(weights)^T as float32 [K, sum(rows)] in this thread's scratch buffer (kernels._scratch_buffer); fma
    layout only."""
    if _cpu_layout() != "fma":
        raise ValueError("panels.widen reads the fma layout only")
    k, n = panels[0].shape[1], sum(rows)
    out = kernels._scratch_buffer(k * n).view(k, n)
    ptrs, ns = _pointers(panels, rows)
    _lib().hk_widen_panels(len(panels), ptrs, ns, k, out.data_ptr(), n, torch.get_num_threads())
    return out


def dot_rows(panel: torch.Tensor, n: int, k: int, r0: int, r1: int) -> torch.Tensor:
    """Rows [r0, r1) (r0 a multiple of ROWS) of an n x k weight in dot-layout panels, as row-major bf16 [r1 - r0, k]
    (for torch's bf16 GEMM on AMX CPUs, a tile of a long prompt's weight at a time)."""
    out = torch.empty(r1 - r0, k, dtype=torch.bfloat16)
    rc = _lib().hk_dot_panels_to_rows(panel.data_ptr(), n, k, r0, r1, out.data_ptr(), torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"hk_dot_panels_to_rows failed with code {rc}")
    return out
