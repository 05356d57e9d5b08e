"""The C decode program (hearth.kernels.decoder) gives exactly the layer-by-layer path's tokens and logprobs."""
import dataclasses

import pytest

from hearth import LLM, SamplingParams
from hearth.kernels import decoder
from hearth.layers import attention
from hearth.models.blocks import DecoderModel
from hearth.weights import apply
from hearth.weights import dispatch
from tests.tiny_models import build_checkpoint, tiny_config

_real_run = apply.run
needs_program = pytest.mark.skipif(decoder._lib() is None, reason="hearth kernels unavailable here")

PROMPTS = [[5, 17, 42, 99, 7], [300, 12], list(range(20, 60))]

CASES = {
    "llama-bf16": (dict(family="llama"), dict(dtype="bfloat16")),
    "qwen2-bias-f32": (dict(family="qwen2", use_sliding_window=False), dict(dtype="float32")),
    "mistral-window-f16": (dict(family="mistral", sliding_window=8), dict(dtype="float16")),
    "llama-int4": (dict(family="llama"), dict(dtype="bfloat16", quantization="int4-g32")),
    "llama-int8": (dict(family="llama", attention_bias=True), dict(dtype="float32", quantization="int8")),
    "llama-int8-bf16": (dict(family="llama"), dict(dtype="bfloat16", quantization="int8")),
    "qwen3-qk-norm-bf16": (dict(family="qwen3"), dict(dtype="bfloat16")),
    "gemma-offset-norm-gelu": (dict(family="gemma"), dict(dtype="float32")),  # (embedding scale stays in Python)
    "phi3-fused-checkpoint": (dict(family="phi3"), dict(dtype="bfloat16")),
    "gemma2-sandwich-softcap-window": (dict(family="gemma2", sliding_window=8), dict(dtype="bfloat16")),
    # (6 layers: five sliding with the local rope table, one full with the global one)
    "gemma3-sandwich-qk-norm-two-ropes": (dict(family="gemma3", sliding_window=8, num_hidden_layers=6),
                                          dict(dtype="float32")),
}


def _generate(llm: LLM, n: int) -> list[tuple[list[int], list[list[tuple[int, float]]]]]:
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, logprobs=5)] * len(PROMPTS)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    return [(o.outputs[0].token_ids, [lp.top for lp in o.outputs[0].logprobs]) for o in outs]


@needs_program
@pytest.mark.parametrize("case", list(CASES))
def test_program_equals_layer_path(case: str, tmp_path, monkeypatch) -> None:
    cfg_kw, engine_kw = CASES[case]
    cfg_kw = dict(cfg_kw)
    cfg_kw.setdefault("num_hidden_layers", 3)
    folder = build_checkpoint(str(tmp_path / case), tiny_config(cfg_kw.pop("family"), **cfg_kw))
    # (no prefix caching: the second run must prefill exactly as the first)
    llm = LLM(folder, kv_cache_space=0.05, max_num_batched_tokens=64, enable_prefix_caching=False, **engine_kw)
    runs, programs = [], []
    real_run = decoder.DecodeProgram.run

    def counted(self, *a, **kw):
        runs.append(a[0].shape[0])
        programs.append(self)
        return real_run(self, *a, **kw)

    monkeypatch.setattr(decoder.DecodeProgram, "run", counted)
    with_program = _generate(llm, 10)
    assert len(PROMPTS) in runs, "the decode steps did not run through the program"
    # bf16 pair panels (AVX512-BF16 CPUs), quantized panels: prompt steps run through it too, and must still match
    # the layer path; except where prompts' attention goes to SDPA (AVX2), which keeps prompt steps on the layer path
    takes_prompts = any(p.takes_prompts for p in programs) and attention.sdpa_min_prompt() is None
    assert (max(runs) > len(PROMPTS)) == takes_prompts
    monkeypatch.setattr(DecoderModel, "_decode_program", lambda self: None)
    assert _generate(llm, 10) == with_program


@needs_program
def test_unsupported_layers_keep_the_layer_path(tmp_path) -> None:
    """OLMo2 (q/k norms over the flat projections) is not a shape the program takes: no program, same engine."""
    folder = build_checkpoint(str(tmp_path / "olmo2"), tiny_config("olmo2"))
    llm = LLM(folder, dtype="float32", kv_cache_space=0.05)
    llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=3, temperature=0.0))
    assert llm.engine.model.model._decode_program() is None
    assert decoder.DecodeProgram.build([], dispatch.program_rows()) is None


@needs_program
@pytest.mark.skipif(not dispatch.caps().gemm, reason="the quantized GEMM does not run on this CPU")
def test_program_equals_layer_path_in_the_gemms_broadcast_form(tmp_path, monkeypatch) -> None:
    """Quantized decode steps with many rows take the GEMM's broadcast form (hk_linear's "bcast" kernel) in both paths:
    BCAST_MIN_M lowered to the GEMM's own threshold so that six sequences reach it. (Plain rows: VNNI panels off.)"""
    monkeypatch.setattr(dispatch, "BCAST_MIN_M", 4)
    off = dataclasses.replace(dispatch.caps(), quant_panels=False)
    monkeypatch.setattr(dispatch, "caps", lambda: off)
    folder = build_checkpoint(str(tmp_path / "q"), tiny_config("llama", num_hidden_layers=2))
    llm = LLM(folder, kv_cache_space=0.05, enable_prefix_caching=False, dtype="float32", quantization="int8")
    prompts = [{"prompt_token_ids": [3 + i, 40 + 7 * i, 9, 100 + i]} for i in range(6)]
    params = [SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3)] * len(prompts)

    def generate() -> list:
        outs = llm.generate(prompts, params)
        return [(o.outputs[0].token_ids, [lp.top for lp in o.outputs[0].logprobs]) for o in outs]

    rows, acts = [], []
    real_program = decoder.DecodeProgram.run
    monkeypatch.setattr(decoder.DecodeProgram, "run", lambda self, *a, **kw: rows.append(a[0].shape[0])
                        or real_program(self, *a, **kw))
    with_program = generate()
    assert max(rows) == len(prompts), "the decode steps did not run through the program"
    monkeypatch.setattr(DecoderModel, "_decode_program", lambda self: None)
    monkeypatch.setattr(apply, "run", lambda *a, **kw: acts.append(kw.get("call")) or _real_run(*a, **kw))
    assert generate() == with_program
    assert "bcast" in acts and "gemm" in acts  # decode steps and prompt steps
