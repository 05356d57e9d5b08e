"""llama.cpp GGUF LoRA adapters against their PEFT source: each random PEFT adapter converted as convert_lora_to_gguf.py
converts it (tests/gguf_lora_writer.py: llama.cpp's names, ggml's dimension order, the llama q/k permutation of B),
then the same mixed batch (adapters and the bare base) run once under the PEFT folders and once under the GGUF
files: greedy tokens identical, top-5 logprobs equal to float32 rounding. On a GGUF base of the same tiny model too,
and on a Q8_0 GGUF base against transformers with each adapter merged (the issue's quantized-base parity).
"""
from __future__ import annotations

import pytest
import torch

from hearth import LLM, SamplingParams
from hearth.lora.request import LoRARequest
from tests.gguf_lora_writer import Q, write_gguf_adapter
from tests.gguf_writer import write_gguf
from tests.lora_adapters import build_adapter
from tests.tiny_models import build_checkpoint, tiny_config

STEPS = 16
ATOL = 1e-4
SHARED = list(range(20, 60))
REQUESTS = [(SHARED, 0), ([5, 17, 42, 99, 7], 1), (SHARED, None), ([201, 202, 203, 204, 205, 206], 2)]
# GGUF adapters carry lora_alpha only (no rsLoRA, no alpha_pattern), as convert_lora_to_gguf.py writes them.
ADAPTERS = [
    dict(r=4, alpha=8, targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
    dict(r=8, alpha=16, targets=("q_proj", "k_proj", "v_proj")),
    dict(r=2, alpha=4, targets=("k_proj", "gate_proj", "up_proj", "down_proj")),
]
FAMILIES = {"llama": {}, "qwen2": dict(use_sliding_window=False), "gemma3": {}}


def adapters(base: str, root, qtype: Q = Q.F32) -> tuple[list[LoRARequest], list[LoRARequest]]:
    """(the PEFT folders, the GGUF files converted from them), ids 1.. and 11.."""
    peft, ggufs = [], []
    for i, spec in enumerate(ADAPTERS):
        folder = build_adapter(base, str(root / f"peft{i}"), seed=300 + i, **spec)
        peft.append(LoRARequest(f"peft{i}", i + 1, folder))
        path = write_gguf_adapter(folder, base, str(root / f"adapter{i}.gguf"), qtype)
        ggufs.append(LoRARequest(f"gguf{i}", i + 11, path))
    return peft, ggufs


def run(llm: LLM, loras: list[LoRARequest]) -> list:
    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True, logprobs=5)
    outs = llm.generate([{"prompt_token_ids": p} for p, _ in REQUESTS], params,
                        lora_request=[loras[i] if i is not None else None for _, i in REQUESTS])
    return [o.outputs[0] for o in outs]


def assert_same(got: list, want: list, atol: float) -> None:
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.token_ids == w.token_ids, f"request {k} (adapter {REQUESTS[k][1]}): tokens differ"
        for step, (a, b) in enumerate(zip(g.logprobs, w.logprobs)):
            ours = dict(a.top)
            for tok, val in b.top:
                if tok in ours:
                    assert abs(ours[tok] - val) < atol, f"request {k} step {step} token {tok}"


def llm(model: str) -> LLM:
    return LLM(model, dtype="float32", kv_cache_space=0.05, max_num_batched_tokens=64, enable_lora=True,
               max_loras=3, max_cpu_loras=6)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_gguf_adapters_match_their_peft_source(family: str, tmp_path) -> None:
    base = build_checkpoint(str(tmp_path / "base"), tiny_config(family, **FAMILIES[family]))
    peft, ggufs = adapters(base, tmp_path)
    engine = llm(base)
    want, got = run(engine, peft), run(engine, ggufs)
    assert_same(got, want, ATOL)
    assert len({tuple(o.token_ids) for o in want[::2]}) == 2  # the adapters change the shared prompt's tokens


def test_gguf_adapters_on_a_gguf_base(tmp_path) -> None:
    """A llama GGUF base (its q/k un-permuted at load) with GGUF adapters (their B un-permuted at read) against the
    HF base with the PEFT folders."""
    base = build_checkpoint(str(tmp_path / "base"), tiny_config("llama"))
    write_gguf(base, tmp_path / "base.gguf")
    peft, ggufs = adapters(base, tmp_path)
    assert_same(run(llm(str(tmp_path / "base.gguf")), ggufs), run(llm(base), peft), 1e-3)


def test_f16_gguf_adapters_follow_their_source(tmp_path) -> None:
    base = build_checkpoint(str(tmp_path / "base"), tiny_config("llama"))
    peft, ggufs = adapters(base, tmp_path, Q.F16)
    engine = llm(base)
    want, got = run(engine, peft), run(engine, ggufs)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]


def test_adapters_on_a_q8_0_gguf_base_against_transformers(tmp_path, monkeypatch) -> None:
    """A Q8_0 GGUF base kept in its blocks, PEFT folders and GGUF adapters in one batch, against transformers
    running the weights as the file decodes them with each adapter merged by PEFT (float activations pinned, as
    tests/models/test_parity_gguf.py does: then the quantization's only error is the weights', which the reference
    shares)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from hearth.weights import activations
    from tests.tiny_models import hf_greedy_loop

    monkeypatch.setattr(activations, "ACTIVATIONS", "float")
    base = build_checkpoint(str(tmp_path / "base"), tiny_config("llama"))
    decoded = write_gguf(base, tmp_path / "base.gguf", Q.Q8_0)
    peft, ggufs = adapters(base, tmp_path)
    engine = llm(str(tmp_path / "base.gguf"))
    assert engine.engine.lora.layers["model.layers.0.self_attn.qkv_proj"].base.qweight is not None  # (in blocks)
    for loras in (peft, ggufs):
        got = run(engine, loras)
        for k, ((prompt, i), out) in enumerate(zip(REQUESTS, got)):
            model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
            model.load_state_dict(decoded, strict=False)
            if i is not None:
                model = PeftModel.from_pretrained(model, peft[i].lora_path).merge_and_unload().eval()
            tokens, tops = hf_greedy_loop(model, prompt, STEPS)
            assert out.token_ids == tokens, f"request {k} (adapter {i}, {loras[0].lora_name}): tokens differ"
            for step, ((ids, vals), lp) in enumerate(zip(tops, out.logprobs)):
                ours = dict(lp.top)
                assert abs(ours[ids[0]] - vals[0]) < 2e-3, f"request {k} step {step}"
