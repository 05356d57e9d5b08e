"""bitsandbytes checkpoints as transformers' save_pretrained writes them.

4-bit (NF4 / FP4), per layer `W.weight` uint8 [N * K / 2, 1] and beside it `W.weight.absmax`, `.quant_map` (the 16
code values), `.quant_state.bitsandbytes__nf4|fp4` (JSON: blocksize, shape, dtype, nested_* for double quant) and,
double-quantized, `.nested_absmax` / `.nested_quant_map`. The flattened weight is cut in blocks of `blocksize`;
byte i holds element 2i in its high nibble and 2i + 1 in its low one; w = quant_map[code] * absmax[block], with a
double-quantized absmax = nested_quant_map[absmax] * nested_absmax[block / nested_blocksize] + nested_offset.
No hearth layout holds a 16-value codebook exactly, so these layers load dense in the model dtype: the floats
bitsandbytes' own dequantize_4bit gives in its compute dtype.

8-bit (LLM.int8): `W.weight` int8 [N, K], `W.SCB` fp32 [N] (absmax per row): w = q * SCB / 127, hearth's int8 rows.
"""
from __future__ import annotations

import json

import torch

from hearth.weights.formats.source import PackedSource
from hearth.weights.packed import QWeight

INV_127 = 7.874015718698502e-3  # bitsandbytes' fp32 constant for 1 / 127


def quant_state(t: dict[str, torch.Tensor]) -> dict:
    key = next(k for k in t if k.startswith("quant_state."))
    state = json.loads(bytes(t[key].tolist()).decode("utf-8"))
    state["quant_type"] = state.get("quant_type") or key.rsplit("__", 1)[-1]
    return state


def dequantize_4bit(t: dict[str, torch.Tensor]) -> torch.Tensor:
    """fp32 [N, K] from one layer's tensors (keys: "weight", "absmax", "quant_map", "quant_state.*", ...)."""
    state = quant_state(t)
    packed = t["weight"].reshape(-1)
    codes = torch.stack([packed >> 4, packed & 0x0F], 1).reshape(-1).long()
    absmax = t["absmax"]
    if "nested_absmax" in t:
        nb = int(state["nested_blocksize"])
        nested = t["nested_absmax"].float().repeat_interleave(nb)[: absmax.numel()]
        absmax = t["nested_quant_map"].float()[absmax.long()] * nested + float(state["nested_offset"])
    n, k = (int(d) for d in state["shape"])
    scale = absmax.float().repeat_interleave(int(state["blocksize"]))[: n * k]
    return (t["quant_map"].float()[codes[: n * k]] * scale).reshape(n, k)


def pack_int8(src: PackedSource) -> QWeight:
    scb = src.tensors["SCB"].float().reshape(-1, 1)
    return QWeight(8, src.shape[1], src.tensors["weight"].contiguous(), (scb * INV_127).contiguous(), None)
