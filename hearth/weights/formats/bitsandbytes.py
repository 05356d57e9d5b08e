"""bitsandbytes checkpoints as transformers' save_pretrained writes them.

4-bit (NF4 / FP4), per layer `W.weight` uint8 [N * K / 2, 1] and beside it `W.weight.absmax`, `.quant_map` (the 16
code values), `.quant_state.bitsandbytes__nf4|fp4` (JSON: blocksize, shape, dtype, nested_* for double quant) and,
double-quantized, `.nested_absmax` / `.nested_quant_map`. The flattened weight is cut in blocks of `blocksize`;
byte i holds element 2i in its high nibble and 2i + 1 in its low one; w = quant_map[code] * absmax[block], with a
double-quantized absmax = nested_quant_map[absmax] * nested_absmax[block / nested_blocksize] + nested_offset.
They load into hearth's "nf4" layout (layouts.TABLE): the codes repacked into hearth's int4 nibble order, the
absmax decoded to fp32 at load (double quant: exactly bitsandbytes' floats), the 16 values kept as the codebook.
`quantize_nf4` writes the same layout from float weights as bitsandbytes' quantize_4bit(quant_type="nf4") does.

8-bit (LLM.int8): `W.weight` int8 [N, K], `W.SCB` fp32 [N] (absmax per row): w = q * SCB / 127, hearth's int8 rows.
"""
from __future__ import annotations

import json

import torch

from hearth.kernels import nf4 as nf4_kernels
from hearth.weights.formats.source import PackedSource
from hearth.weights.packed import QWeight, pack_u4

INV_127 = 7.874015718698502e-3  # bitsandbytes' fp32 constant for 1 / 127


def quant_state(t: dict[str, torch.Tensor]) -> dict:
    key = next(k for k in t if k.startswith("quant_state."))
    state = json.loads(bytes(t[key].tolist()).decode("utf-8"))
    state["quant_type"] = state.get("quant_type") or key.rsplit("__", 1)[-1]
    return state


# bitsandbytes' NF4 values (functional.get_4bit_type("nf4"), fp32): quantiles of N(0, 1) scaled to [-1, 1].
NF4 = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
       -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
       0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0)
BLOCKSIZE = 64  # bitsandbytes' quantize_4bit default (and transformers' bnb_4bit default)
_CHUNK = 1 << 22  # elements quantized at a time (bounded temporaries on a 7B layer)


def codes_and_absmax(t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, int, tuple[int, int]]:
    """One layer's tensors (keys: "weight", "absmax", "quant_map", "quant_state.*", ...) -> (codes uint8 [N * K]
    over the flattened weight, absmax fp32 per block of it (double quant decoded as bitsandbytes decodes it),
    blocksize, shape)."""
    state = quant_state(t)
    packed = t["weight"].reshape(-1)
    n, k = (int(d) for d in state["shape"])
    codes = torch.stack([packed >> 4, packed & 0x0F], 1).reshape(-1)[: n * k]
    absmax = t["absmax"]
    if "nested_absmax" in t:
        nb = int(state["nested_blocksize"])
        nested = t["nested_absmax"].float().repeat_interleave(nb)[: absmax.numel()]
        absmax = t["nested_quant_map"].float()[absmax.long()] * nested + float(state["nested_offset"])
    return codes, absmax.float(), int(state["blocksize"]), (n, k)


def dequantize_4bit(t: dict[str, torch.Tensor]) -> torch.Tensor:
    """fp32 [N, K] from one layer's tensors: bitsandbytes' dequantize_4bit in fp32."""
    codes, absmax, bs, (n, k) = codes_and_absmax(t)
    scale = absmax.repeat_interleave(bs)[: n * k]
    return (t["quant_map"].float()[codes.long()] * scale).reshape(n, k)


def pack_4bit(src: PackedSource) -> QWeight:
    """A pre-quantized NF4 / FP4 layer -> the "nf4" layout (blocks within rows: K % blocksize == 0, which
    prepare.pack_parts checks through `supports` before calling this)."""
    codes, absmax, bs, (n, k) = codes_and_absmax(src.tensors)
    return QWeight(4, bs, pack_u4(codes.reshape(n, k)), absmax.reshape(n, k // bs).contiguous(), None,
                   codebook=src.tensors["quant_map"].float().contiguous())


def quantize_nf4(w: torch.Tensor, blocksize: int = BLOCKSIZE, kernel: bool = True) -> QWeight:
    """Float [N, K] (K % blocksize == 0) -> the "nf4" layout, the codes and absmax bitsandbytes'
    quantize_4bit(w, blocksize, quant_type="nf4") computes on CPU (the same fp32 operations, in the same order)."""
    n, k = w.shape
    code = torch.tensor(NF4, dtype=torch.float32)
    bounds = (code[:-1] + code[1:]) / 2  # NF4 is sorted: its midpoints are bitsandbytes' bucket bounds
    if kernel and w.dtype == torch.float32 and w.stride(-1) == 1 and nf4_kernels.available():
        done = nf4_kernels.quantize(w, blocksize, bounds)  # (the same fp32 operations, in C)
        if done is not None:
            return QWeight(4, blocksize, done[0], done[1], None, codebook=code)
    flat = w.reshape(-1, blocksize)
    codes = torch.empty(flat.shape, dtype=torch.uint8)
    absmax = torch.empty(flat.shape[0], dtype=torch.float32)
    step = max(1, _CHUNK // blocksize)
    for b0 in range(0, flat.shape[0], step):
        a = flat[b0:b0 + step].float()
        am = a.abs().max(dim=-1)[0]
        scaled = torch.clamp(a * (1.0 / am.clamp(min=1e-38).view(-1, 1)), -1, 1)
        codes[b0:b0 + step] = torch.bucketize(scaled, bounds, out_int32=True).to(torch.uint8)
        absmax[b0:b0 + step] = am
    return QWeight(4, blocksize, pack_u4(codes.reshape(n, k)), absmax.reshape(n, k // blocksize), None,
                   codebook=code)


def pack_int8(src: PackedSource) -> QWeight:
    scb = src.tensors["SCB"].float().reshape(-1, 1)
    return QWeight(8, src.shape[1], src.tensors["weight"].contiguous(), (scb * INV_127).contiguous(), None)
