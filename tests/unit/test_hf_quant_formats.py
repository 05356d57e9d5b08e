"""Pre-quantized HF formats: hearth's repacked weights dequantize to the format's own (q - zero) * scale bit for bit
(random codes over the full range, every variant), and unsupported variants fail in one line naming what works."""
from __future__ import annotations

import pytest
import torch

from hearth.config import HFConfig
from hearth.loader import hf_quant
from hearth.errors import LoadError
from hearth.weights import prepare
from hearth.weights.reference import dequantize
from tests import quant_checkpoints as qc

N, K = 96, 256

GPTQ = [(bits, group, sym, desc, v1) for bits, group, sym, desc, v1 in
        [(4, 32, False, False, True), (4, 64, True, False, True), (4, 128, False, True, True),
         (4, -1, True, False, False), (4, 128, False, False, False), (4, 32, True, True, False),
         (8, 128, True, False, True), (8, -1, True, True, False), (8, 32, True, False, False)]]


def _check(spec: hf_quant.QuantSpec, tensors: dict, expected: torch.Tensor) -> None:
    stream = list(hf_quant.assemble(iter([(f"layer.proj.{k}", v) for k, v in tensors.items()]), spec))
    assert [name for name, _ in stream] == ["layer.proj.weight"]
    src = stream[0][1]
    assert src.shape == tuple(expected.shape)
    for packed in (prepare.pack(src.method, src.layout, src), prepare.pack_parts([src], "prequant", K, None)):
        got = dequantize(packed)
        perm = prepare.input_perm([src])
        if perm is not None:
            got = got[:, torch.argsort(perm)]
        assert torch.equal(got, expected)


@pytest.mark.parametrize("bits,group,sym,desc_act,v1", GPTQ)
def test_gptq_dequantizes_bit_for_bit(bits: int, group: int, sym: bool, desc_act: bool, v1: bool) -> None:
    gen = torch.Generator().manual_seed(bits * 1000 + group)
    g = K if group == -1 else group
    g_idx = None
    if desc_act:  # act order: a permutation of equal groups
        g_idx = torch.empty(K, dtype=torch.long)
        g_idx[torch.randperm(K, generator=gen)] = torch.arange(K) // g
    q, z, s, g_idx = qc.codes(N, K, bits, g, sym, gen, g_idx=g_idx)
    if bits == 4 and not sym:
        z[0, 0], z[1, 0] = 0, 15  # (v1 stores zero - 1: 0 wraps to 15)
    spec = hf_quant.read_spec("/nonexistent", HFConfig(quantization_config=qc.quant_config("gptq", bits, group, sym,
                                                                                          desc_act, v1)))
    _check(spec, qc.gptq_tensors(q, z, s, g_idx, bits, v1), qc.reference(q, z, s, g_idx))


@pytest.mark.parametrize("group", [128, 64])
def test_awq_gemm_dequantizes_bit_for_bit(group: int) -> None:
    gen = torch.Generator().manual_seed(group)
    q, z, s, g_idx = qc.codes(N, K, 4, group, False, gen)
    spec = hf_quant.read_spec("/nonexistent", HFConfig(quantization_config=qc.quant_config("awq", 4, group, False)))
    _check(spec, qc.awq_tensors(q, z, s), qc.reference(q, z, s, g_idx))


@pytest.mark.parametrize("bits,group,sym", [(4, 32, True), (4, 128, False), (4, -1, True), (8, -1, True),
                                            (8, 64, True)])
def test_compressed_tensors_dequantizes_bit_for_bit(bits: int, group: int, sym: bool) -> None:
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    gen = torch.Generator().manual_seed(bits + group)
    g = K if group == -1 else group
    q, z, s, g_idx = qc.codes(N, K, bits, g, sym, gen)
    s = s.to(torch.bfloat16)
    tensors = qc.ct_tensors(q, z, s, bits, sym)
    if bits == 4:  # the package reads back the signed codes it packed
        assert torch.equal(unpack_from_int32(tensors["weight_packed"], 4, torch.Size([N, K])), (q - 8).to(torch.int8))
    spec = hf_quant.read_spec("/nonexistent", HFConfig(quantization_config=qc.quant_config("compressed-tensors",
                                                                                          bits, group, sym)))
    _check(spec, tensors, qc.reference(q, z, s, g_idx))


@pytest.mark.parametrize("config,message", [
    (dict(quant_method="gptq", bits=3, group_size=128), "GPTQ 3-bit is not supported; hearth loads GPTQ 4/8-bit"),
    (dict(quant_method="gptq", bits=4, group_size=128, checkpoint_format="marlin"), "checkpoint_format 'marlin'"),
    (dict(quant_method="awq", bits=4, group_size=128, version="gemv"), "AWQ 4-bit version 'gemv'"),
    (dict(quant_method="exl2", bits=4), "quant_method 'exl2' is not supported"),
    (qc.quant_config("compressed-tensors", 8, -1, False), "asymmetric int8"),
])
def test_unsupported_variants_fail_in_one_line(config: dict, message: str) -> None:
    with pytest.raises(LoadError, match=message) as e:
        hf_quant.read_spec("/nonexistent", HFConfig(quantization_config=config))
    assert "\n" not in str(e.value) and "AWQ 4-bit GEMM" in str(e.value)


def test_gptq_8bit_asymmetric_fails_naming_the_fix() -> None:
    gen = torch.Generator().manual_seed(3)
    q, z, s, g_idx = qc.codes(N, K, 8, 64, False, gen)
    spec = hf_quant.read_spec("/x", HFConfig(quantization_config=qc.quant_config("gptq", 8, 64, False)))
    (_, src), = hf_quant.assemble(iter([(f"p.{k}", v) for k, v in qc.gptq_tensors(q, z, s, g_idx, 8).items()]),
                                  spec)
    with pytest.raises(ValueError, match="sym=false"):
        prepare.pack(src.method, src.layout, src)


def test_requested_quantization_must_match_the_checkpoint() -> None:
    spec = hf_quant.read_spec("/x", HFConfig(quantization_config=qc.quant_config("awq", 4, 128, False)))
    hf_quant.check_requested(spec, None, "m")
    hf_quant.check_requested(spec, "awq", "m")
    with pytest.raises(LoadError, match="already quantized \\(awq\\): drop --quantization int8"):
        hf_quant.check_requested(spec, "int8", "m")
    with pytest.raises(LoadError, match="has no quantization_config"):
        hf_quant.check_requested(None, "gptq", "m")


def test_a_layer_missing_a_tensor_is_named() -> None:
    spec = hf_quant.read_spec("/x", HFConfig(quantization_config=qc.quant_config("awq", 4, 128, False)))
    with pytest.raises(LoadError, match="layers.0.q_proj lacks qzeros"):
        list(hf_quant.assemble(iter([("layers.0.q_proj.qweight", torch.zeros(8, 1, dtype=torch.int32)),
                                     ("layers.0.q_proj.scales", torch.zeros(1, 8))]), spec))
