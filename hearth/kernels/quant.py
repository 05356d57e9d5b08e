"""ctypes calls of the quantized-weight kernels (csrc/quant*.cpp) on raw tensors and format codes.

Which call runs for a weight and a row count is hearth.weights.dispatch's choice; what the bytes mean is
hearth.weights.layouts'. This module only checks return codes and passes pointers, strides and format codes.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from hearth import kernels
from hearth.kernels import _build

_DTYPE_CODE = kernels._DTYPE_CODE

# hq_linear's kernel argument (csrc/hk_api.h QuantKernel): the few-row kernel per activation rounding, and the
# fp32-x GEMM in its plain / broadcast form.
LINEAR_KERNELS = {"float": 0, "int8": 1, "int8x2": 2, "gemm": 3, "bcast": 4}


@functools.cache
def _lib() -> ctypes.CDLL | None:
    lib = _build.load()
    if lib is None or not hasattr(lib, "hq_linear"):
        return None
    return lib


def available() -> bool:
    """True when the compiled quantized kernels run here."""
    return kernels.available() and _lib() is not None


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _stride0(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.stride(0)


def linear(call: str, x: torch.Tensor, data: torch.Tensor, code: int, n: int, scales: torch.Tensor,
           mins: torch.Tensor | None, group: int, bias: torch.Tensor | None, out: torch.Tensor,
           isa_code: int | None = None) -> torch.Tensor:
    """hq_linear with the LINEAR_KERNELS kernel `call`: x [M, K] (unit stride along K) against the weight in format
    `code` -> out fp32 [M, N] (contiguous); bias fp32 contiguous or None."""
    m, k = x.shape
    rc = _lib().hq_linear(
        x.data_ptr(), _DTYPE_CODE[x.dtype], m, k, x.stride(0), data.data_ptr(), code, n, data.stride(0),
        scales.data_ptr(), _ptr(mins), scales.stride(0), group, _ptr(bias), out.data_ptr(), LINEAR_KERNELS[call],
        isa_code or kernels.isa(), torch.get_num_threads(), int(scales.dtype == torch.float16))
    if rc != 0:
        raise RuntimeError(f"hq_linear ({call}) failed with code {rc}")
    return out


def linear_panels(x: torch.Tensor, data: torch.Tensor, code: int, n: int, scales: torch.Tensor,
                  mins: torch.Tensor | None, group: int, bias: torch.Tensor | None, f32: torch.Tensor,
                  out16: torch.Tensor | None, x2: bool) -> None:
    """hq_linear_panels_out: x [M, K] contiguous on VNNI panels into f32 [M, N] (or, with out16, the result rounded
    to bf16 there and f32 the partial sums); x in two int8 terms per block (x2) or one."""
    m, k = x.shape
    rc = _lib().hq_linear_panels_out(x.data_ptr(), _DTYPE_CODE[x.dtype], m, k, k, data.data_ptr(), code, n,
                                     scales.data_ptr(), _ptr(mins), group, _ptr(bias), f32.data_ptr(), _ptr(out16),
                                     torch.get_num_threads(), int(scales.dtype == torch.float16), int(x2))
    if rc != 0:
        raise RuntimeError(f"hq_linear_panels_out failed with code {rc}")


def dequant_rows(data: torch.Tensor, code: int, k: int, scales: torch.Tensor, mins: torch.Tensor | None, group: int,
                 start: int, end: int, isa_code: int | None = None) -> torch.Tensor:
    """Rows [start, end) of the weight dequantized, fp32 [end - start, K]."""
    out = torch.empty(end - start, k, dtype=torch.float32)
    rc = _lib().hq_dequant(data.data_ptr(), code, k, data.stride(0), scales.data_ptr(), _ptr(mins),
                           scales.stride(0), group, start, end, out.data_ptr(), isa_code or kernels.isa(),
                           torch.get_num_threads(), int(scales.dtype == torch.float16))
    if rc != 0:
        raise RuntimeError(f"hq_dequant failed with code {rc}")
    return out


def dequant_gather(data: torch.Tensor, code: int, n: int, k: int, scales: torch.Tensor, mins: torch.Tensor | None,
                   group: int, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` (int64 contiguous) dequantized, fp32 [len(ids), K]; IndexError for an id outside [0, n)."""
    out = torch.empty(ids.numel(), k, dtype=torch.float32)
    rc = _lib().hq_dequant_gather(data.data_ptr(), code, k, data.stride(0), scales.data_ptr(), _ptr(mins),
                                  scales.stride(0), group, n, ids.data_ptr(), ids.numel(), out.data_ptr(),
                                  kernels.isa(), torch.get_num_threads(), int(scales.dtype == torch.float16))
    if rc == -4:
        raise IndexError(f"token id out of range for an embedding table of {n} rows")
    if rc != 0:
        raise RuntimeError(f"hq_dequant_gather failed with code {rc}")
    return out


def pack_panels(src: torch.Tensor, bits: int, n: int, k: int, dst: torch.Tensor) -> bool:
    """int8 / int4 plain rows (unit stride along K) into VNNI panels in dst; False where the packer cannot run."""
    lib = _lib() if available() else None
    return lib is not None and lib.hq_pack_panels(src.data_ptr(), bits, n, k, src.stride(0), dst.data_ptr(),
                                                  torch.get_num_threads()) == 0


def pack_panels_blocks(raw: torch.Tensor, bits: int, n: int, k: int, block_bytes: int, header: int,
                       dst: torch.Tensor) -> bool:
    """GGUF block rows (block_bytes each, weights after `header` bytes) into VNNI panels in dst; False on failure."""
    lib = _lib() if available() else None
    return lib is not None and lib.hq_pack_panels_blocks(raw.data_ptr(), bits, n, k, raw.stride(0), block_bytes,
                                                         header, dst.data_ptr(), torch.get_num_threads()) == 0
