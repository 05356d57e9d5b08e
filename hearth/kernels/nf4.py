"""ctypes calls of the 4-bit codebook kernels (csrc/nf4.cpp: bitsandbytes NF4 / FP4) on raw tensors; their linear is
hk_linear on the weight's descriptor (hearth.kernels.weight).

What the bytes mean is hearth.weights.layouts' row "nf4"; which call runs at which row count, hearth.weights.dispatch.
"""
from __future__ import annotations

import torch

from hearth import kernels
from hearth.kernels import _build


def available() -> bool:
    """The codebook kernels are compiled here (its linear is hk_linear on a codebook weight, with AVX-512 and AVX2
    bodies; quantize has an AVX-512 body only, and the caller's torch form elsewhere)."""
    return kernels.available() and _build.load() is not None and hasattr(_build.load(), "hq_nf4_dequant")


def dequant_rows(data: torch.Tensor, absmax: torch.Tensor, group: int, codebook: torch.Tensor, k: int, start: int,
                 end: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rows [start, end) of the weight, fp32 (or bf16: the fp32 values rounded as .to(torch.bfloat16) rounds)."""
    out = torch.empty(end - start, k, dtype=dtype)
    rc = _build.load().hq_nf4_dequant(data.data_ptr(), k, data.stride(0), absmax.data_ptr(), absmax.stride(0), group,
                                      codebook.data_ptr(), start, end, out.data_ptr(), int(dtype == torch.bfloat16),
                                      torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"hq_nf4_dequant failed with code {rc}")
    return out


def quantize(w: torch.Tensor, group: int, bounds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """w fp32 [N, K] (unit stride along K) -> (codes uint8 [N, K / 2] in hearth's int4 order, absmax fp32
    [N, K / group]) as bitsandbytes' quantize_4bit computes them with these 15 bucket bounds; None without AVX-512."""
    n, k = w.shape
    codes = torch.empty(n, k // 2, dtype=torch.uint8)
    absmax = torch.empty(n, k // group, dtype=torch.float32)
    bounds = bounds.float().contiguous()
    rc = _build.load().hq_nf4_quantize(w.data_ptr(), n, k, w.stride(0), group, bounds.data_ptr(), codes.data_ptr(),
                                       codes.stride(0), absmax.data_ptr(), absmax.stride(0), torch.get_num_threads())
    if rc == -1:
        return None
    if rc != 0:
        raise RuntimeError(f"hq_nf4_quantize failed with code {rc}")
    return codes, absmax
