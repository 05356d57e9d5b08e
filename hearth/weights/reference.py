"""Dequantization in torch: the reference every kernel matches (the layout table's dequantize column)."""
from __future__ import annotations

import torch

from hearth.weights.packed import QWeight, unpack_u4
from hearth.weights.relayout import plain


def dequantize(qw: QWeight) -> torch.Tensor:
    """Reference dequantization (torch): fp32 [N, K], the same floats the kernels compute in registers."""
    qw = plain(qw)
    n, k = qw.shape
    g = qw.group
    s = qw.scales.float()[..., None]
    if qw.bits == 8:
        return (qw.data.float().reshape(n, k // g, g) * s).reshape(n, k)
    if qw.codebook is not None:  # codebook[q] * absmax: bitsandbytes' own fp32 product
        return (qw.codebook[unpack_u4(qw.data).long()].reshape(n, k // g, g) * s).reshape(n, k)
    q = unpack_u4(qw.data).float().reshape(n, k // g, g)
    return torch.addcmul(implied_mins(qw)[..., None], q, s).reshape(n, k)  # q * s + min, like the kernel's fma


def implied_mins(qw: QWeight) -> torch.Tensor:
    """int4 mins, stored or (symmetric int4) -8 * scales; exact in fp32 either way."""
    qw = plain(qw)
    return qw.mins.float() if qw.mins is not None else -8.0 * qw.scales.float()
