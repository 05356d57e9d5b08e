"""AWQ GEMM (AutoAWQ, `version: gemm`) 4-bit -> hearth int4 rows, exactly.

Checkpoint tensors per linear layer (K inputs, N outputs, G = K / group):
    qweight int32 [K, N / 8]   packed along N in AWQ's interleaved order: nibble i of a word holds column
                               8c + (0, 2, 4, 6, 1, 3, 5, 7)[i]
    qzeros  int32 [G, N / 8]   the same packing
    scales  fp16  [G, N]
    w[n, k] = (q[k, n] - zero[k / group, n]) * scale[k / group, n]
"""
from __future__ import annotations

import torch

from hearth.weights.formats.bits import unpack_cols
from hearth.weights.formats.source import PackedSource
from hearth.weights.packed import QWeight, pack_u4

# Column 8c + t sits in nibble REVERSE_ORDER[t] (the inverse of AutoAWQ's pack order 0, 2, 4, 6, 1, 3, 5, 7).
REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)


def _unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    v = unpack_cols(packed, 4)
    return v.reshape(v.shape[0], -1, 8)[:, :, list(REVERSE_ORDER)].reshape(v.shape[0], -1)


def unpack(src: PackedSource) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q [N, K], zeros [N, G], scales [N, G] fp32)."""
    n, _ = src.shape
    t = src.tensors
    return _unpack_awq(t["qweight"])[:, :n].t(), _unpack_awq(t["qzeros"])[:, :n].t(), t["scales"].float().t()


def pack(src: PackedSource) -> QWeight:
    q, z, s = unpack(src)
    return QWeight(4, src.group, pack_u4(q.to(torch.uint8).contiguous()), s.contiguous(),
                   (-z.float() * s).contiguous())
