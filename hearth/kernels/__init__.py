"""hearth's compiled CPU kernels (csrc/, built on first use into ~/.cache/hearth/kernels/<hash>): the ISA they run
with, and the dense linear calls.

    from hearth import kernels
    y = kernels.run_linear(x, w, bias)   # hk_linear: x [M, K], w [N, K] rows in bf16 / f16 / f32, fp32 accumulate
                                         # (every linear reads its weight's descriptor: kernels.weight)
    y = kernels.torch_linear(x, w, bias) # torch's GEMM, in fp32 where the 16-bit one would be emulated

Which of them runs for a row count is hearth.weights.dispatch's choice (hearth.weights.apply calls them). This
package imports nothing above it: no layers, models or engine. The kernels read weights in their stored layout
(bf16 -> fp32 is a 16-bit shift, f16 uses F16C) and never run without AVX2 + FMA + F16C (HEARTH_KERNELS=0: never;
HEARTH_KERNELS_ISA=avx2: the AVX2 path on an AVX-512 CPU).
"""
from __future__ import annotations

import ctypes
import functools
import threading

import torch
import torch.nn.functional as F

from hearth.kernels import _build, weight
from hearth.platform import cpu_info

ISA_AVX2 = 1
ISA_AVX512 = 2


_WEIGHT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
LOSSLESS_16BIT = (torch.bfloat16, torch.float16)
_X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@functools.cache
def isa() -> int | None:
    """ISA code the kernels use on this CPU, or None if it lacks AVX2+FMA+F16C (the kernels then never run).
    HEARTH_KERNELS_ISA=avx2 is already in cpu_info(), which then shows no AVX-512."""
    info = cpu_info()
    if not (info.has_avx2 and "f16c" in info.flags):
        return None
    return ISA_AVX512 if info.has_avx512 else ISA_AVX2


def library() -> ctypes.CDLL | None:
    """The compiled kernels (compiled on first call), or None where they cannot be built or loaded."""
    return _build.load()


@functools.cache
def available() -> bool:
    """True when the compiled kernels can run on this CPU (compiles them on first call)."""
    return isa() is not None and _build.load() is not None


_DTYPE_CODE = weight.DTYPE_CODE  # (the C dtype codes; weight.py holds them: it cannot import this package)
BF16_PANELS, BF16_DOT_PANELS = 3, 4  # hk_weight's dense format codes of bf16 weights in panels / pair panels


def run_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, kblock: int = 0,
               isa_code: int | None = None, desc: weight.Weight | None = None) -> torch.Tensor:
    """hk_linear on x [M, K] (any strides), w [N, K] rows in bf16 / f16 / f32 -> [M, N] in x's dtype, fp32
    accumulate; desc: w's descriptor (weight.dense([w]); built here if None); no dtype/device checks beyond what C
    needs (kernel_ok)."""
    m, k = x.shape
    n = w.shape[0]
    if x.stride(1) != 1 or (m > 1 and x.stride(0) < k):
        x = x.contiguous()
    if desc is None or kblock:
        if w.stride(1) != 1 or (n > 1 and w.stride(0) < k):
            w = w.contiguous()
        desc = weight.dense([w], kblock=kblock)
    if bias is not None:
        bias = bias.to(torch.float32).contiguous()
    out = torch.empty(m, n, dtype=torch.float32)
    weight.linear(x, desc, bias, out, isa_code=isa_code or isa())
    return out if x.dtype == torch.float32 else out.to(x.dtype)


def run_linear_parts(x: torch.Tensor, desc: weight.Weight, bias: torch.Tensor | None) -> torch.Tensor:
    """hk_linear (hearth.weights.apply's dense parts and panels): x [..., K] against the dense weight `desc`
    describes (row blocks or bf16 panels, weight.dense) plus bias, fp32 accumulate; returns [..., N] in x's dtype."""
    k, n = desc.k, desc.n
    m = x.numel() // k
    x2 = x.reshape(m, k)
    if x2.stride(1) != 1 or (m > 1 and x2.stride(0) < k):
        x2 = x2.contiguous()
    b = bias.to(torch.float32).contiguous() if bias is not None else None
    if desc.desc.format == BF16_DOT_PANELS and x2.dtype == torch.bfloat16:  # bf16 straight from the tiles
        out = torch.empty(m, n, dtype=torch.bfloat16)
        weight.linear(x2, desc, b, None, out16=out, isa_code=isa())
        return out.reshape(*x.shape[:-1], n)
    out = torch.empty(m, n, dtype=torch.float32)
    weight.linear(x2, desc, b, out, isa_code=isa())
    out = out if x.dtype == torch.float32 else out.to(x.dtype)
    return out.reshape(*x.shape[:-1], n)


def kernel_ok(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> bool:
    return (x.device.type == "cpu" and w.device.type == "cpu" and w.dim() == 2 and x.dim() >= 1
            and w.dtype in _WEIGHT_DTYPES and x.dtype in _X_DTYPES and w.shape[0] > 0 and w.shape[1] > 0
            and (bias is None or (bias.dim() == 1 and bias.shape[0] == w.shape[0]))
            and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))
            and available())


def emulated(dtype: torch.dtype) -> bool:
    """True when torch's GEMM in this dtype would be emulated here (f16, or bf16 without AVX512-BF16/AMX)."""
    return dtype == torch.float16 or (dtype == torch.bfloat16 and not cpu_info().has_native_bf16)


def torch_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear; in fp32 when dtypes differ or when 16-bit matmul would be emulated (no AVX512-BF16/AMX here):
    torch's bf16 GEMM on an AVX2 CPU runs at ~1/4 of its fp32 speed, far more than the cost of widening w."""
    emulated_here = emulated(w.dtype)
    if x.dtype != w.dtype or emulated_here:
        b = bias.float() if bias is not None else None
        return F.linear(x.float(), widen(w, scratch=True), b).to(x.dtype)
    return F.linear(x, w, bias)


_scratch = threading.local()


def _scratch_buffer(numel: int) -> torch.Tensor:
    """This thread's reusable fp32 buffer, at least numel long (valid until the next scratch call): a prefill
    GEMM's widened weight is used once, and a fresh tensor per call would pay page faults several times the cost of
    writing into touched pages."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.numel() < numel:
        buf = _scratch.buf = torch.empty(numel, dtype=torch.float32)
    return buf[:numel]


def _widen_into(t: torch.Tensor, out: torch.Tensor) -> None:
    if _build.load().hk_widen(t.data_ptr(), _DTYPE_CODE[t.dtype], t.numel(), out.data_ptr(), torch.get_num_threads()):
        raise RuntimeError("hk_widen failed")


def widen(t: torch.Tensor, scratch: bool = False) -> torch.Tensor:
    """t as float32, through hk_widen for 16-bit CPU tensors (vector, all threads); scratch=True: into this
    thread's reusable buffer (see _scratch_buffer)."""
    if t.dtype not in LOSSLESS_16BIT or t.device.type != "cpu" or not available():
        return t.float()
    t = t.contiguous()
    out = _scratch_buffer(t.numel()).view(t.shape) if scratch else torch.empty(t.shape, dtype=torch.float32)
    _widen_into(t, out)
    return out


def widen_parts(parts: list[torch.Tensor]) -> torch.Tensor:
    """cat(parts) (row blocks [N_i, K], 16-bit, contiguous) as float32 in this thread's scratch buffer."""
    k = parts[0].shape[1]
    out = _scratch_buffer(sum(p.shape[0] for p in parts) * k).view(-1, k)
    row = 0
    for p in parts:
        _widen_into(p, out[row:row + p.shape[0]])
        row += p.shape[0]
    return out
