"""compressed-tensors (llm-compressor) integer weights -> hearth int8 / int4 rows, exactly.

    int-quantized / naive-quantized (W8A8, W8A16):  weight int8 [N, K], weight_scale [N, 1] (channel), [N, G]
        (group) or one value (tensor); w = q * s. Activation scales (input_scale) are not used: hearth's kernels
        round x their own way (hearth.weights.activations).
    pack-quantized (W4A16, W8A16): weight_packed int32 [N, K * bits / 32], each word's value j in bits
        [bits * j, bits * j + bits), stored as q + 2^(bits-1); weight_shape [2] = (N, K); weight_scale [N, G];
        asymmetric: weight_zero_point int32 [N * bits / 32, G] packed along N the same way (zero + 2^(bits-1)).
        w = (q - zero) * s.
"""
from __future__ import annotations

import torch

from hearth.weights.formats.bits import unpack_cols, unpack_rows
from hearth.weights.formats.source import PackedSource
from hearth.weights.packed import QWeight, pack_u4


def _scales(src: PackedSource) -> torch.Tensor:
    n, k = src.shape
    s = src.tensors["weight_scale"].float()
    return s.reshape(1, 1).expand(n, k // src.group) if s.numel() == 1 else s.reshape(n, k // src.group)


def unpack(src: PackedSource) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q [N, K] int32 unsigned (offset by 2^(bits-1)), zeros [N, G] unsigned alike, scales [N, G] fp32)."""
    n, k = src.shape
    t = src.tensors
    s = _scales(src)
    off = 1 << (src.bits - 1)
    if "weight_packed" in t:
        q = unpack_cols(t["weight_packed"], src.bits)[:, :k]
    else:
        q = t["weight"].to(torch.int32) + off
    zp = t.get("weight_zero_point")
    if zp is None or zp.numel() == 0:
        z = torch.full(s.shape, off, dtype=torch.int32)
    elif "weight_packed" in t:
        z = unpack_rows(zp, src.bits)[:n]
    else:  # (int8 weights: zero points as stored, one per scale)
        z = (zp.to(torch.int32) + off).reshape(-1, 1 if zp.numel() in (1, n) else s.shape[1]).expand(s.shape)
    return q, z, s


def pack(src: PackedSource) -> QWeight:
    q, z, s = unpack(src)
    if src.bits == 8:
        if not bool((z == 128).all()):
            raise ValueError("compressed-tensors 8-bit with zero points (symmetric: false) is not supported: "
                             "hearth's int8 layout is symmetric; use a symmetric W8A8 / W8A16 checkpoint")
        return QWeight(8, src.group, (q - 128).to(torch.int8).contiguous(), s.contiguous(), None)
    return QWeight(4, src.group, pack_u4(q.to(torch.uint8).contiguous()), s.contiguous(),
                   (-z.float() * s).contiguous())
