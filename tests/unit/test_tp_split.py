"""Tensor parallelism's cut of quantized layers (hearth.weights.split through QuantLinear.tp_slice): for every source
a quantized layer loads from (float weights quantized at load, each kept GGUF type, each pre-quantized format), the
slice one rank packs dequantizes to exactly the same rows / columns of the whole layer one rank packs."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from hearth.layers.quant_linear import QuantLinear
from hearth.weights import reference, split
from hearth.weights.formats.source import PackedSource
from hearth.weights.gguf import GGUFBlocks
from tests import quant_checkpoints as qc
from tests.unit.test_quant import _k_blocks

Q = gguf.GGMLQuantizationType
K = 512
SHARDS = {"q": 128, "k": 64, "v": 64}  # a merged qkv: rank 1 of 2 keeps rows 64.., 128 + 32.., 192 + 32..
ROWS = ((64, 64), (160, 32), (224, 32))
COLS = (384, 128)  # rank 3 of 4 along K: inside Q4_K / Q6_K super-blocks, on 32-weight blocks


def _gguf(qtype: Q):
    def make(n: int, seed: int) -> GGUFBlocks:
        if qtype in (Q.Q4_K, Q.Q6_K):
            raw = _k_blocks(qtype, n, K, seed)
        else:
            raw = gguf.quants.quantize(np.random.default_rng(seed).standard_normal((n, K)).astype(np.float32), qtype)
        return GGUFBlocks(int(qtype), (n, K), torch.from_numpy(np.ascontiguousarray(raw)))
    return make


def _prequant(method: str, bits: int, group: int, act_order: bool = False):
    def make(n: int, seed: int) -> PackedSource:
        gen = torch.Generator().manual_seed(seed)
        g = K if group == -1 else group
        g_idx = torch.randperm(K, generator=torch.Generator().manual_seed(7)) // g if act_order else None
        q, z, s, g_idx = qc.codes(n, K, bits, g, bits == 8, gen, g_idx=g_idx)
        t = (qc.gptq_tensors(q, z, s, g_idx, bits) if method == "gptq" else qc.awq_tensors(q, z, s)
             if method == "awq" else qc.ct_tensors(q, z, s, bits, bits == 8))
        options = {"zero_offset": 1} if method == "gptq" else {}
        return PackedSource(method, bits, g, (n, K), t, options)
    return make


def _float(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, K, generator=torch.Generator().manual_seed(seed))


SOURCES = {  # name: (scheme, make(rows, seed))
    "int8": ("int8", _float), "int4-g64": ("int4-g64", _float),
    "Q8_0": ("gguf", _gguf(Q.Q8_0)), "Q4_0": ("gguf", _gguf(Q.Q4_0)), "Q4_1": ("gguf", _gguf(Q.Q4_1)),
    "Q4_K": ("gguf", _gguf(Q.Q4_K)), "Q6_K": ("gguf", _gguf(Q.Q6_K)),
    "gptq4-g64": ("prequant", _prequant("gptq", 4, 64)), "gptq8-channel": ("prequant", _prequant("gptq", 8, -1)),
    "awq-g128": ("prequant", _prequant("awq", 4, 128)), "ct-w4-g32": ("prequant", _prequant("compressed-tensors", 4, 32)),
}


def _load(scheme: str, make, tp: split.Slice | None, shards: dict[str, int] | None) -> QuantLinear:
    rows = sum(shards.values()) if shards else 128
    lin = QuantLinear(K, rows, shard_sizes=shards, scheme=scheme)
    lin.tp_slice = tp
    for i, (name, n) in enumerate((shards or {None: rows}).items()):
        lin.load_shard("weight", name, make(n, i))
    return lin


def _weight(lin: QuantLinear) -> torch.Tensor:
    assert lin.qweight is not None  # (kept quantized: the slice did not fall back to dense)
    return reference.dequantize(lin.qweight)


@pytest.mark.parametrize("source", list(SOURCES))
def test_a_ranks_slice_is_the_whole_layers_rows_and_columns_exactly(source: str) -> None:
    scheme, make = SOURCES[source]
    whole = _weight(_load(scheme, make, None, SHARDS))
    got = _weight(_load(scheme, make, split.Slice("qkv", rows=ROWS), SHARDS))
    assert torch.equal(got, split.dense_rows(whole, ROWS))
    whole = _weight(_load(scheme, make, None, None))
    got = _weight(_load(scheme, make, split.Slice("o_proj", cols=COLS), None))
    assert torch.equal(got, whole[:, COLS[0]:sum(COLS)])


def test_slices_off_the_quantization_groups_and_act_order_columns_are_refused() -> None:
    with pytest.raises(ValueError, match="o_proj: its 512 inputs split 8 ways give 64 columns, not a multiple of "
                                         "its 128-weight quantization groups"):
        _load("prequant", _prequant("awq", 4, 128), split.Slice("o_proj", cols=(64, 64)), None)
    act = _prequant("gptq", 4, 64, act_order=True)
    with pytest.raises(ValueError, match="GPTQ act-order"):
        _load("prequant", act, split.Slice("down_proj", cols=COLS), None)
    whole = _load("prequant", act, None, SHARDS)
    rows = _load("prequant", act, split.Slice("qkv", rows=ROWS), SHARDS)  # rows keep the layer's input order
    assert torch.equal(rows.in_perm, whole.in_perm)
    assert torch.equal(_weight(rows), split.dense_rows(_weight(whole), ROWS))


def test_another_ranks_expert_holds_nothing() -> None:
    lin = _load("gguf", _gguf(Q.Q4_0), split.Slice("experts.1.down_proj"), None)
    assert lin.qweight is None and lin.weight.numel() == 0


def test_activation_rounding_is_chosen_for_the_whole_model_not_a_ranks_half(monkeypatch) -> None:
    from hearth.weights import activations

    monkeypatch.setattr(activations, "ACTIVATIONS", "int8x2")
    monkeypatch.setattr(activations, "AUTO_ACTIVATIONS", True)
    half = [_load("int4-g64", _float, split.Slice("o_proj", cols=COLS), None).qweight]  # 128 x 128 of 128 x 512
    monkeypatch.setattr(activations, "ONE_TERM_MIN_WEIGHTS", 128 * 256)
    assert activations.set_model_activations(half) == "int8x2"  # one rank's count alone: too small for one term
    assert activations.set_model_activations(half, ranks=2) == "int8"  # two ranks: the model one rank would see
