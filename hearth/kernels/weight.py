"""One descriptor per packed weight (csrc/hk_api.h `hk_weight`) and the one linear call that reads it (`hk_linear`).

    desc = weight.dense([w])                                 # dense rows (or row blocks, or bf16 panels)
    desc = weight.quantized(data, code, n, k, scales, mins, group)   # a QWeight's tensors and layout code
    weight.linear(x, desc, bias, out, kernel=weight.KERNELS["int8"], isa_code=kernels.isa())

The descriptor is built once per weight (hearth.weights.apply caches it on the QWeight / the dense tensor) and
passed by address, so a call packs 11 scalar arguments instead of the weight's 6-10 loose ones. What the format
codes mean is hearth.weights.layouts'; which `kernel` runs for a row count, hearth.weights.dispatch's.
"""
from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch

from hearth.kernels import _build

i64, i32, ptr = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p

MAX_PARTS = 8  # kWeightMaxParts
# hk_linear's kernel argument (hk_api.h QuantKernel): the few-row kernel per activation rounding (VNNI panels:
# "int8x2" two int8 terms, else one), and the fp32-x GEMM in its plain / broadcast form. Dense and codebook
# weights ignore it.
KERNELS = {"float": 0, "int8": 1, "int8x2": 2, "gemm": 3, "bcast": 4}
DTYPE_CODE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


class HkWeight(ctypes.Structure):
    """hk_api.h's hk_weight, field for field."""

    _fields_ = [("data", ptr), ("format", i32), ("quantized", i32), ("N", i64), ("K", i64), ("ldw", i64),
                ("scales", ptr), ("mins", ptr), ("ldg", i64), ("group", i64), ("scale_f16", i32), ("nparts", i32),
                ("codebook", ptr), ("kblock", i64), ("part_w", ptr * MAX_PARTS), ("part_n", i64 * MAX_PARTS)]


class Weight:
    """A descriptor with the tensors it points at (kept alive as long as it is) and its address for the call."""

    __slots__ = ("desc", "addr", "tensors", "ptrs", "n", "k")

    def __init__(self, desc: HkWeight, tensors: tuple) -> None:
        self.desc, self.addr, self.tensors = desc, ctypes.addressof(desc), tensors
        self.ptrs, self.n, self.k = _ptrs(tensors), desc.N, desc.K

    def describes(self, *tensors: torch.Tensor | None) -> bool:
        """True while the descriptor still describes these tensors (the same objects, each one's storage where it
        was): a weight whose tensors were replaced or moved since (any of them: the huge-page pass may move the
        scales and leave the data) gets a new descriptor."""
        return (len(tensors) <= len(self.tensors) and all(a is b for a, b in zip(tensors, self.tensors))
                and _ptrs(self.tensors) == self.ptrs)

    def __reduce__(self):  # a copied / pickled weight (deepcopy of a module) rebuilds its descriptor: no raw pointers
        return (type(None), ())


def _ptrs(tensors: tuple) -> tuple[int, ...]:
    return tuple(0 if t is None else t.data_ptr() for t in tensors)


def _p(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def dense(parts: Sequence[torch.Tensor], code: int | None = None, rows: Sequence[int] | None = None,
          ldw: int | None = None, kblock: int = 0, k: int | None = None) -> Weight:
    """Dense weight in row blocks parts[i] [rows[i], K] (default: their shape[0]; bf16 panels [P, K, 32]: the rows
    each holds) in layout `code` (default: the parts' dtype as rows); ldw: row stride in elements (default:
    parts[0]'s); k: K where the parts' shape does not say it (flat panel buffers)."""
    if not 1 <= len(parts) <= MAX_PARTS:
        raise ValueError(f"a dense weight takes 1 to {MAX_PARTS} parts, got {len(parts)}")
    p0 = parts[0]
    rows = [p.shape[0] for p in parts] if rows is None else list(rows)
    if k is None:
        k = p0.shape[1] if p0.dim() == 3 else p0.shape[-1]  # (bf16 panels: [P, K, 32])
    d = HkWeight(data=p0.data_ptr(), format=DTYPE_CODE[p0.dtype] if code is None else code, quantized=0,
                 N=sum(rows), K=k, ldw=(p0.stride(0) if p0.dim() == 2 else k) if ldw is None else ldw,
                 nparts=len(parts), kblock=kblock, scale_f16=0, ldg=0, group=0)
    for i, (p, n) in enumerate(zip(parts, rows)):
        d.part_w[i], d.part_n[i] = p.data_ptr(), n
    return Weight(d, tuple(parts))


def quantized(data: torch.Tensor, code: int, n: int, k: int, scales: torch.Tensor, mins: torch.Tensor | None,
              group: int, codebook: torch.Tensor | None = None) -> Weight:
    """A quantized [n, k] weight: data in layout `code` (rows, tiles, VNNI panels, codebook indices), scales (and
    mins) fp32 or fp16 (codebook: fp32 absmax), codebook its 16 fp32 values."""
    d = HkWeight(data=data.data_ptr(), format=code, quantized=1, N=n, K=k, ldw=data.stride(0),
                 scales=scales.data_ptr(), mins=_p(mins), ldg=scales.stride(0) if scales.dim() else 0, group=group,
                 scale_f16=int(scales.dtype == torch.float16), nparts=1, codebook=_p(codebook), kblock=0)
    d.part_w[0], d.part_n[0] = d.data, n
    return Weight(d, (data, scales, mins, codebook))


def linear(x: torch.Tensor, w: Weight, bias: torch.Tensor | None, out: torch.Tensor | None,
           out16: torch.Tensor | None = None, kernel: int = 0, *, isa_code: int) -> None:
    """hk_linear: x [M, K] (unit stride along K) . W^T + bias (fp32 contiguous or None) -> out fp32 [M, N]
    contiguous (or out16 bf16 [M, N], out then the panels' fp32 scratch or None); isa_code: hearth.kernels.isa()'s
    (or a forced one); raises on an error code."""
    rc = _build.load().hk_linear(x.data_ptr(), DTYPE_CODE[x.dtype], x.shape[0], x.stride(0), w.addr, _p(bias),
                                 _p(out), _p(out16), kernel, isa_code, torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"hk_linear (format {w.desc.format}, kernel {kernel}) failed with code {rc}")
