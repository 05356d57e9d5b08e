"""GPTQ (AutoGPTQ, GPTQModel, optimum) -> hearth int4 / int8 rows, exactly.

Checkpoint tensors per linear layer (K inputs, N outputs, G = K / group groups, p = 32 / bits values a word):
    qweight int32 [K / p, N]   packed along K: word i of column n holds rows i * p .. i * p + p - 1
    qzeros  int32 [G, N / p]   packed along N; format "gptq" (v1) stores zero - 1 (wrapping), "gptq_v2" the zero
    scales  fp16  [G, N]
    g_idx   int32 [K]          the group of each input column (act-order / desc_act: not sorted)
    w[n, k] = (q[k, n] - zero[g_idx[k], n]) * scale[g_idx[k], n]
Act-order: the columns are permuted at load so each group is contiguous (stable sort by g_idx), and the layer gathers
x by the same permutation at run time (input_perm): exact, and the kernels keep contiguous groups.
8-bit goes to the symmetric int8 layout, so its zero points must all be 128 (sym=true).
"""
from __future__ import annotations

import torch

from hearth.weights.formats.bits import unpack_cols, unpack_rows
from hearth.weights.formats.source import PackedSource
from hearth.weights.packed import QWeight, pack_u4


def _g_idx(src: PackedSource) -> torch.Tensor:
    k = src.shape[1]
    g = src.tensors.get("g_idx")
    return torch.arange(k) // src.group if g is None else g.long()


def input_perm(src: PackedSource) -> torch.Tensor | None:
    """The stable sort of g_idx (None when already sorted); each group must then be `group` contiguous columns."""
    g = _g_idx(src)
    seq = torch.arange(src.shape[1]) // src.group
    if torch.equal(g, seq):
        return None
    perm = torch.argsort(g, stable=True)
    if not torch.equal(g[perm], seq):
        raise ValueError(f"GPTQ g_idx does not split the {src.shape[1]} columns into groups of {src.group}")
    return perm


def unpack(src: PackedSource) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q [N, K] int32, zeros [N, G] int32, scales [N, G] fp32) in the checkpoint's column order."""
    n, k = src.shape
    t = src.tensors
    q = unpack_rows(t["qweight"], src.bits)[:k].t()
    z = unpack_cols(t["qzeros"], src.bits)[:, :n].t()
    if src.options.get("zero_offset", 0):
        z = (z + src.options["zero_offset"]) & ((1 << src.bits) - 1)
    return q, z, t["scales"].float().t()


def pack(src: PackedSource) -> QWeight:
    q, z, s = unpack(src)
    perm = input_perm(src)
    if perm is not None:
        q = q[:, perm]
    if src.bits == 8:
        if not bool((z == 128).all()):
            raise ValueError("GPTQ 8-bit with zero points other than 128 (sym=false) is not supported: hearth's "
                             "int8 layout is symmetric; use a sym=true 8-bit or a 4-bit checkpoint")
        return QWeight(8, src.group, (q - 128).to(torch.int8).contiguous(), s.contiguous(), None)
    # (q - z) * s = q * s + (-z * s): each product exact in fp32 for fp16 scales, so the fma gives the same floats
    return QWeight(4, src.group, pack_u4(q.to(torch.uint8)), s.contiguous(), (-z.float() * s).contiguous())
