"""Pack functions from float weights (EngineArgs.quantization int8 / int4): quantized at load, in torch."""
from __future__ import annotations

import torch

from hearth.weights.packed import QWeight, pack_u4


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
