"""Pre-quantized checkpoints end to end: a tiny Llama written in each format loads quantized, and (kernels rounding
x as floats) gives the greedy tokens and logprobs transformers gives on the same model with the dequantized weights;
with the default rounding it loads through EngineArgs and generates."""
from __future__ import annotations

import pytest

from hearth import LLM, SamplingParams
from hearth.layers.quant_linear import QuantLinear
from hearth.weights import activations
from tests import quant_checkpoints as qc
from tests.models.parity import assert_greedy_parity
from tests.tiny_models import build_checkpoint, hf_greedy, tiny_config

PROMPTS = [[5, 17, 42, 99, 7], list(range(20, 60))]

VARIANTS = {  # name: (method, bits, group, sym, desc_act, v1)
    "gptq4-asym-g32-act-order": ("gptq", 4, 32, False, True, True),
    "gptq4-sym-g128-v2": ("gptq", 4, 128, True, False, False),
    "gptq8-sym-channel": ("gptq", 8, -1, True, False, True),
    "awq-g64": ("awq", 4, 64, False, False, True),
    "ct-w4a16-asym-g32": ("compressed-tensors", 4, 32, False, False, True),
    "ct-w8a8-channel": ("compressed-tensors", 8, -1, True, False, True),
}


@pytest.fixture(scope="module")
def float_model(tmp_path_factory) -> str:
    cfg = tiny_config("llama", hidden_size=128, intermediate_size=256, num_hidden_layers=2)
    return build_checkpoint(str(tmp_path_factory.mktemp("prequant") / "float"), cfg)


def _quantized(llm: LLM) -> list[QuantLinear]:
    return [m for m in llm.engine.model.modules() if isinstance(m, QuantLinear) and m.qweight is not None]


@pytest.mark.parametrize("name", list(VARIANTS))
def test_greedy_parity_with_the_dequantized_model(float_model: str, tmp_path, monkeypatch, name: str) -> None:
    method, bits, group, sym, desc_act, v1 = VARIANTS[name]
    out, deq = str(tmp_path / "q"), str(tmp_path / "deq")
    qc.write_folder(float_model, out, deq, method, bits, group, sym, desc_act, v1)
    monkeypatch.setattr(activations, "ACTIVATIONS", "float")
    monkeypatch.setattr(activations, "AUTO_ACTIVATIONS", False)
    assert_greedy_parity(out, steps=16, prompts=PROMPTS, expected=hf_greedy(deq, PROMPTS, 16))


def test_loads_through_engine_args_with_the_default_rounding(float_model: str, tmp_path) -> None:
    out, deq = str(tmp_path / "q"), str(tmp_path / "deq")
    qc.write_folder(float_model, out, deq, "gptq", 4, 64, False, desc_act=True)
    llm = LLM(out, quantization="gptq", kv_cache_space=0.05)
    layers = _quantized(llm)  # qkv, o, gate_up, down per layer, all kept in int4 with their act order
    assert len(layers) == 8 and {m.qweight.bits for m in layers} == {4} and all(m.in_perm is not None for m in layers)
    got = llm.generate([{"prompt_token_ids": PROMPTS[0]}], SamplingParams(temperature=0.0, max_tokens=8,
                                                                           ignore_eos=True))
    assert len(got[0].outputs[0].token_ids) == 8
    with pytest.raises(ValueError, match="already quantized \\(gptq\\)"):
        LLM(out, quantization="int4", kv_cache_space=0.05)
