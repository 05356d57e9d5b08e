"""ctypes calls of the quantized-weight kernels (csrc/quant*.cpp) on raw tensors and format codes.

Which call runs for a weight and a row count is hearth.weights.dispatch's choice; what the bytes mean is
hearth.weights.layouts'. This module only checks return codes and passes pointers, strides and format codes. The
linear itself is hk_linear on the weight's descriptor (hearth.kernels.weight).
"""
from __future__ import annotations

import ctypes
import functools

import torch

from hearth import kernels
from hearth.kernels import _build

_DTYPE_CODE = kernels._DTYPE_CODE

@functools.cache
def _lib() -> ctypes.CDLL | None:
    lib = _build.load()
    if lib is None or not hasattr(lib, "hq_dequant"):
        return None
    return lib


def available() -> bool:
    """True when the compiled quantized kernels run here."""
    return kernels.available() and _lib() is not None


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _stride0(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.stride(0)


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


def pack_panel_scales_blocks(raw: torch.Tensor, n: int, k: int, block_bytes: int, offset: int) -> torch.Tensor | None:
    """The fp16 field at byte `offset` of each GGUF block of raw's rows (a scale, a Q4_1 min) in the panels' layout
    [ceil(n / 64), k / 32 * 64] (as packed.panel_scales of them); None where the packer cannot run."""
    lib = _lib() if available() else None
    if lib is None:
        return None
    out = torch.empty(-(-n // 64), k // 32 * 64, dtype=torch.float16)
    rc = lib.hq_pack_panel_scales_blocks(raw.data_ptr(), n, k, raw.stride(0), block_bytes, offset, out.data_ptr(),
                                         torch.get_num_threads())
    return out if rc == 0 else None
