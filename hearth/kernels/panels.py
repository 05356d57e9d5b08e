"""bf16 weights in 32-row panels (csrc/panel.cpp), for AVX-512 machines without native bf16 GEMMs.

    if panels.supported():
        w_panel = panels.pack(w, out)                 # w [N, K] bf16 -> [ceil(N/32), K, 32] bf16 (a view of out)
        y = panels.linear(x, [w_panel], [N], bias)    # = F.linear(x, w, bias) in x's dtype, fp32 accumulate

Why: a decode step with several sequences multiplies a few x rows by every weight. On row-major weights the
kernel computes dot products (one conversion per 4 FMAs, horizontal sums at the end); in panels it broadcasts x
values into FMAs against 32 outputs' weights at once, reading each thread's weights as one sequential stream.
Measured against the row kernel (Qwen2.5-0.5B gate_up 4864 x 896, 2 threads, 2-vCPU Skylake-SP): M = 8 1.56 ->
0.89 ms, M = 32 4.85 -> 3.35 ms, the 151936-row head at M = 8 68 -> 34 ms; M = 1 at parity. From 4 rows the
kernel runs as a blocked GEMM (csrc/panel.cpp, linear_tiled) that also beats widening the panels to fp32 for
torch.mm up to TILED_MAX_M rows (M = 128: ~1.4x); longer prefills widen the panels into an fp32 [K, N] scratch and
run torch's GEMM, ahead there by 5-15%. HEARTH_PANELS=0 keeps row-major weights.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from hearth import envs, kernels
from hearth.kernels import _build

ROWS = 32  # outputs per panel
TILED_MAX_M = 512  # rows up to which the panel GEMM runs; more: widened weights + torch.mm
DTYPE_CODE = 3  # the w_dtype hk_linear_parts takes for panel weights


@functools.cache
def _lib() -> ctypes.CDLL | None:
    lib = _build.load()
    if lib is None:
        return None
    i64, i32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    lib.hk_pack_panels.argtypes = [ptr, i64, i64, i64, ptr, i32]
    lib.hk_pack_panels.restype = i32
    lib.hk_widen_panels.argtypes = [i64, ptr, ptr, i64, ptr, i64, i32]
    lib.hk_widen_panels.restype = i32
    return lib


def supported() -> bool:
    """True where packing pays and the kernels run: AVX-512, no native bf16 GEMM, kernels built, not disabled."""
    from hearth.platform import cpu_info

    if not envs.panels_enabled():
        return False
    return kernels.isa() == kernels.ISA_AVX512 and not cpu_info().has_native_bf16 and _lib() is not None


def lane(i: torch.Tensor) -> torch.Tensor:
    """Where row i (0..31) of a panel sits among the 32 values of one k: rows i and 16 + i share a 32-bit lane."""
    return (i % 16) * 2 + i // 16


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
    _lib().hk_pack_panels(w.data_ptr(), n, k, w.stride(0), out.data_ptr(), torch.get_num_threads())
    return out[:size].view(-1, k, ROWS)


def place(w: torch.Tensor, out: torch.Tensor, pack_now: bool = True) -> torch.Tensor:
    """w's panels in out, as pack() returns them: packed from w, or (pack_now=False) already there, e.g. read
    from a cache file written by an earlier run."""
    return pack(w, out) if pack_now else out[:numel(*w.shape)].view(-1, w.shape[1], ROWS)


def _pointers(panels: list[torch.Tensor], rows: list[int]) -> tuple[ctypes.Array, ctypes.Array]:
    return (ctypes.c_void_p * len(panels))(*[p.data_ptr() for p in panels]), (ctypes.c_int64 * len(rows))(*rows)


def widen(panels: list[torch.Tensor], rows: list[int]) -> torch.Tensor:
    """cat(weights)^T as float32 [K, sum(rows)] in this thread's scratch buffer (kernels._scratch_buffer)."""
    k, n = panels[0].shape[1], sum(rows)
    out = kernels._scratch_buffer(k * n).view(k, n)
    ptrs, ns = _pointers(panels, rows)
    _lib().hk_widen_panels(len(panels), ptrs, ns, k, out.data_ptr(), n, torch.get_num_threads())
    return out


def linear(x: torch.Tensor, panels: list[torch.Tensor], rows: list[int],
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] . cat(weights)^T (+ bias), the weights as panels (part i: rows[i] outputs); x's dtype out."""
    k, n = panels[0].shape[1], sum(rows)
    m = x.numel() // k
    if m > TILED_MAX_M:  # long prefill: one fp32 GEMM on the widened weights
        y = torch.mm(x.reshape(m, k).float(), widen(panels, rows))
        if bias is not None:
            y += bias.float()
        return y.to(x.dtype).reshape(*x.shape[:-1], n)
    return kernels.run_linear_parts(x, [p.data_ptr() for p in panels], rows, DTYPE_CODE, k, bias)
