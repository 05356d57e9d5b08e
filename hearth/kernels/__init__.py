"""CPU linear kernels for decode shapes (few tokens, big weights), where torch's F.linear is far below bandwidth.

    from hearth import kernels
    y = kernels.linear(x, w, bias)   # any x [..., K], w [N, K] in bf16 / f16 / f32; picks the fastest path

`linear` uses the C++ kernel for M <= MAX_KERNEL_M tokens and torch F.linear above that (prefill), and F.linear
whenever the kernel cannot run here (no compiler, CPU without AVX2+FMA+F16C, HEARTH_KERNELS=0, other dtypes).
The kernel reads the weights in their stored layout (no repacking): bf16 -> fp32 is a 16-bit shift, f16 uses
F16C, accumulation is fp32, output is in x's dtype. Compiled on first use into ~/.cache/hearth/kernels/<hash>.

Environment: HEARTH_KERNELS=0 disables the kernels; HEARTH_KERNELS_ISA=avx2 forces the AVX2 path on an
AVX-512 machine.
"""
from __future__ import annotations

import ctypes
import functools
import os
import threading

import torch
import torch.nn.functional as F

from hearth.kernels import _build
from hearth.platform import cpu_info

ISA_AVX2 = 1
ISA_AVX512 = 2


_WEIGHT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
LOSSLESS_16BIT = (torch.bfloat16, torch.float16)
_X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@functools.cache
def isa() -> int | None:
    """ISA code the kernels use on this CPU, or None if it lacks AVX2+FMA+F16C (the kernels then never run)."""
    info = cpu_info()
    forced = os.environ.get("HEARTH_KERNELS_ISA", "").strip().lower()
    if not (info.has_avx2 and "f16c" in info.flags):
        return None
    if info.has_avx512 and forced != "avx2":
        return ISA_AVX512
    return ISA_AVX2


# Above this many tokens F.linear (fp32 GEMM, 16-bit weights widened first) is used. Measured, torch 2.13 / MKL:
# 2-core EPYC (Zen 3, AVX2), one thread, hot W [1024, 2048] bf16: the kernel ahead up to M = 32 (~50 vs ~35 GF/s),
# behind at M = 64 (~27 vs ~37). 2-vCPU Skylake-SP (AVX-512, no AVX512-BF16), 2 threads, Qwen2.5-0.5B shapes, bf16
# weights from memory (kernel_vs_sgemm.py): ahead at M = 64 (101-112 vs 72-95 GF/s), behind from M = 128
# (80-113 vs 112-141). Machines with native bf16 GEMMs are not measured.
MAX_KERNEL_M = 64 if isa() == ISA_AVX512 else 32


@functools.cache
def available() -> bool:
    """True when the compiled kernels can run on this CPU (compiles them on first call)."""
    return isa() is not None and _build.load() is not None


_DTYPE_CODE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
BF16_PANELS, BF16_DOT_PANELS = 3, 4  # hk_linear_parts' w_dtype for bf16 weights in panels / pair panels


def _run(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, kblock: int = 0,
         isa_code: int | None = None) -> torch.Tensor:
    """The C++ kernel on x [M, K] (any strides), w [N, K]; no dtype/device checks beyond what C needs."""
    lib = _build.load()
    m, k = x.shape
    n = w.shape[0]
    if x.stride(1) != 1 or (m > 1 and x.stride(0) < k):
        x = x.contiguous()
    if w.stride(1) != 1 or (n > 1 and w.stride(0) < k):
        w = w.contiguous()
    if bias is not None:
        bias = bias.to(torch.float32).contiguous()
    out = torch.empty(m, n, dtype=torch.float32)
    rc = lib.hk_linear(x.data_ptr(), _DTYPE_CODE[x.dtype], m, k, x.stride(0), w.data_ptr(), _DTYPE_CODE[w.dtype],
                       n, w.stride(0), bias.data_ptr() if bias is not None else None, out.data_ptr(),
                       isa_code or isa(), kblock, torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"hk_linear failed with code {rc}")
    return out if x.dtype == torch.float32 else out.to(x.dtype)


def linear_parts(x: torch.Tensor, parts: list[torch.Tensor], bias: torch.Tensor | None = None) -> torch.Tensor:
    """linear(x, cat(parts), bias) without the cat: parts [N_i, K] (same dtype, contiguous) are the row blocks of
    one weight, e.g. q/k/v as the checkpoint stores them. One kernel call for few tokens; for more, one fp32 GEMM on
    the parts widened into one scratch weight (16-bit parts whose GEMM would run in fp32 anyway); else F.linear per
    part."""
    m = x.numel() // x.shape[-1] if x.dim() >= 1 else 0
    n = sum(p.shape[0] for p in parts)
    uniform = (x.shape[-1] == parts[0].shape[1] and all(p.is_contiguous() and p.dtype == parts[0].dtype for p in parts)
               and (bias is None or bias.shape == (n,)))
    if (uniform and m > MAX_KERNEL_M and parts[0].dtype in LOSSLESS_16BIT and available()
            and (x.dtype != parts[0].dtype or _emulated(parts[0].dtype))):
        # Prefill: every part widened into consecutive rows of one fp32 scratch weight, then one GEMM straight
        # into the merged output (no per-part outputs, no cat: at 2048 tokens those were ~7% of a Qwen prefill).
        b = bias.float() if bias is not None else None
        return F.linear(x.float(), widen_parts(parts), b).to(x.dtype)
    if (len(parts) == 1 or not 0 < m <= MAX_KERNEL_M or len(parts) > 8 or not uniform
            or not _kernel_ok(x, parts[0], None)):
        biases = [None] * len(parts) if bias is None else list(bias.split([p.shape[0] for p in parts]))
        return torch.cat([linear(x, p, b) for p, b in zip(parts, biases)], dim=-1)
    return run_linear_parts(x, [p.data_ptr() for p in parts], [p.shape[0] for p in parts],
                            _DTYPE_CODE[parts[0].dtype], parts[0].shape[1], bias)


def run_linear_parts(x: torch.Tensor, pointers: list[int], rows: list[int], w_dtype_code: int, ldw: int,
                     bias: torch.Tensor | None) -> torch.Tensor:
    """The hk_linear_parts call behind linear_parts and panels.linear: x [..., K] against the weight parts at
    `pointers` (part i: rows[i] outputs, in w_dtype_code's layout, row stride ldw) plus bias, fp32 accumulate;
    returns [..., sum(rows)] in x's dtype."""
    k, n = x.shape[-1], sum(rows)
    m = x.numel() // k
    x2 = x.reshape(m, k)
    if x2.stride(1) != 1 or (m > 1 and x2.stride(0) < k):
        x2 = x2.contiguous()
    b = bias.to(torch.float32).contiguous() if bias is not None else None
    ptrs, ns = (ctypes.c_void_p * len(pointers))(*pointers), (ctypes.c_int64 * len(rows))(*rows)
    if w_dtype_code == BF16_DOT_PANELS and x2.dtype == torch.bfloat16:  # bf16 straight from the tiles
        out = torch.empty(m, n, dtype=torch.bfloat16)
        rc = _build.load().hk_linear_dot_panels_bf16(x2.data_ptr(), _DTYPE_CODE[x2.dtype], m, k, x2.stride(0),
                                                     len(rows), ptrs, ns, b.data_ptr() if b is not None else None,
                                                     out.data_ptr(), torch.get_num_threads())
        if rc != 0:
            raise RuntimeError(f"hk_linear_dot_panels_bf16 failed with code {rc}")
        return out.reshape(*x.shape[:-1], n)
    out = torch.empty(m, n, dtype=torch.float32)
    rc = _build.load().hk_linear_parts(x2.data_ptr(), _DTYPE_CODE[x2.dtype], m, k, x2.stride(0), len(rows),
                                       ptrs, ns, w_dtype_code, ldw,
                                       b.data_ptr() if b is not None else None, out.data_ptr(), isa(), 0,
                                       torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"hk_linear_parts failed with code {rc}")
    out = out if x.dtype == torch.float32 else out.to(x.dtype)
    return out.reshape(*x.shape[:-1], n)


def _direct(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    if not available():
        raise RuntimeError("hearth kernels are not available on this machine; use hearth.kernels.linear")
    if w.dtype != dtype:
        raise TypeError(f"expected {dtype} weights, got {w.dtype}")
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"x must be [M, K] and w [N, K], got {tuple(x.shape)} and {tuple(w.shape)}")
    if x.dtype not in _X_DTYPES:
        raise TypeError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
    if bias is not None and bias.numel() != w.shape[0]:
        raise ValueError(f"bias must have {w.shape[0]} elements, got {bias.numel()}")
    return _run(x, w, bias)


def linear_bf16(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (f32/bf16/f16) @ w[N, K].T (bf16) + bias -> [M, N] in x's dtype, fp32 accumulate."""
    return _direct(x, w, bias, torch.bfloat16)


def linear_f16(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """As linear_bf16 with float16 weights (F16C conversion)."""
    return _direct(x, w, bias, torch.float16)


def linear_f32(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """As linear_bf16 with float32 weights."""
    return _direct(x, w, bias, torch.float32)


def _kernel_ok(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> bool:
    return (x.device.type == "cpu" and w.device.type == "cpu" and w.dim() == 2 and x.dim() >= 1
            and w.dtype in _WEIGHT_DTYPES and x.dtype in _X_DTYPES and w.shape[0] > 0 and w.shape[1] > 0
            and (bias is None or (bias.dim() == 1 and bias.shape[0] == w.shape[0]))
            and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))
            and available())


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x w^T + b like F.linear (x [..., K], w [N, K]); output in x's dtype.

    Few tokens (M <= MAX_KERNEL_M): the C++ kernel, weights read once at close to memory bandwidth.
    More tokens (prefill): F.linear, in fp32 when x and w dtypes differ or 16-bit GEMM is not native here.
    """
    if x.dim() >= 1 and x.shape[-1] == w.shape[-1] and _kernel_ok(x, w, bias):
        m = x.numel() // x.shape[-1]
        if 0 < m <= MAX_KERNEL_M:
            return _run(x.reshape(m, x.shape[-1]), w, bias).reshape(*x.shape[:-1], w.shape[0])
    return _fallback(x, w, bias)


def _emulated(dtype: torch.dtype) -> bool:
    """True when torch's GEMM in this dtype would be emulated here (f16, or bf16 without AVX512-BF16/AMX)."""
    return dtype == torch.float16 or (dtype == torch.bfloat16 and not cpu_info().has_native_bf16)


def _fallback(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear; in fp32 when dtypes differ or when 16-bit matmul would be emulated (no AVX512-BF16/AMX here):
    torch's bf16 GEMM on an AVX2 CPU runs at ~1/4 of its fp32 speed, far more than the cost of widening w."""
    emulated = _emulated(w.dtype)
    if x.dtype != w.dtype or emulated:
        b = bias.float() if bias is not None else None
        return F.linear(x.float(), widen(w, scratch=True), b).to(x.dtype)
    return F.linear(x, w, bias)


_scratch = threading.local()


def _scratch_buffer(numel: int) -> torch.Tensor:
    """This thread's reusable fp32 buffer, at least numel long (valid until the next scratch call): a prefill
    GEMM's widened weight is used once, and a fresh 92 MB tensor per TinyLlama gate_up call cost ~60 ms of page
    faults (vs ~18 ms into touched pages)."""
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
