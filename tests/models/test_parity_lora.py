"""LoRA parity: four different random PEFT adapters and the bare base model in ONE batch through hearth, against
transformers with each adapter merged into the weights (peft's merge_and_unload): greedy tokens identical, top-5
logprobs close, for Llama, Qwen2, Qwen3 and Gemma 3. Two adapters and the base get the same long prompt, so a
prefix-cache block shared across adapters would show as wrong tokens. A bf16 base follows the float32 reference
within bf16's rounding; on a quantized (int8) base, each adapter's tokens in the mixed batch equal its tokens when it
runs alone."""
from __future__ import annotations

import pytest
import torch

from hearth import LLM, SamplingParams
from hearth.lora.request import LoRARequest
from tests.lora_adapters import build_adapter, merged_model
from tests.tiny_models import build_checkpoint, hf_greedy_loop, tiny_config

STEPS = 24
ATOL = 2e-3  # float32 both sides: the delta's own matmuls vs merged weights differ only in summation order
BF16_ATOL, BF16_MARGIN = 0.05, 0.05  # bf16 compute against the float32 reference (test_parity_bf16_compute's)
SHARED = list(range(20, 60))  # 40 tokens: two full KV blocks and a partial one
# (prompt, adapter index or None for the base model)
REQUESTS = [(SHARED, 0), ([5, 17, 42, 99, 7], 1), (SHARED, None), ([201, 202, 203, 204, 205, 206], 2), (SHARED, 3)]
# Four different adapters: ranks, scales (rsLoRA too) and target sets differ.
ADAPTERS = [
    dict(r=4, alpha=8, targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
    dict(r=8, alpha=16, targets=("q_proj", "v_proj")),
    dict(r=2, alpha=4, targets=("gate_proj", "up_proj", "down_proj")),
    dict(r=16, alpha=8, targets=("k_proj", "o_proj", "up_proj"), use_rslora=True),
]
FAMILIES = {
    "llama": dict(family="llama"),
    "qwen2": dict(family="qwen2", use_sliding_window=False),
    "qwen3": dict(family="qwen3"),
    "gemma3": dict(family="gemma3"),
}


def make_adapters(base: str, root) -> list[LoRARequest]:
    return [LoRARequest(f"adapter{i}", i + 1, build_adapter(base, str(root / f"adapter{i}"), seed=100 + i, **spec))
            for i, spec in enumerate(ADAPTERS)]


def run(llm: LLM, requests, loras: list[LoRARequest]) -> list:
    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True, logprobs=5)
    outs = llm.generate([{"prompt_token_ids": p} for p, _ in requests], params,
                        lora_request=[loras[i] if i is not None else None for _, i in requests])
    return [o.outputs[0] for o in outs]


def references(base: str, loras: list[LoRARequest]) -> list[tuple[list[int], list]]:
    """transformers' greedy tokens and top-5 logprobs for each request, its adapter merged (float32)."""
    models, out = {}, []
    for prompt, i in REQUESTS:
        if i not in models:
            models[i] = merged_model(base, loras[i].lora_path if i is not None else None)
        out.append(hf_greedy_loop(models[i], prompt, STEPS))
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_four_adapters_and_the_base_in_one_batch(family: str, tmp_path) -> None:
    kwargs = dict(FAMILIES[family])
    base = build_checkpoint(str(tmp_path / "base"), tiny_config(kwargs.pop("family"), **kwargs))
    loras = make_adapters(base, tmp_path)
    llm = LLM(base, dtype="float32", kv_cache_space=0.05, max_num_batched_tokens=64, enable_lora=True, max_loras=4,
              max_cpu_loras=4)
    got = run(llm, REQUESTS, loras)
    for k, ((tokens, tops), out) in enumerate(zip(references(base, loras), got)):
        assert out.token_ids == tokens, f"request {k} (adapter {REQUESTS[k][1]}): tokens differ"
        for step, ((ids, vals), lp) in enumerate(zip(tops, out.logprobs)):
            ours = dict(lp.top)
            for tok, val in zip(ids, vals):
                if tok in ours:
                    assert abs(ours[tok] - val) < ATOL, f"request {k} step {step} token {tok}: {ours[tok]} vs {val}"
    assert len({tuple(o.token_ids) for o in got[::2]}) == 3  # the shared prompt: three different continuations
    bm = llm.engine.block_manager
    assert bm.num_used_blocks == 0 and llm.engine.lora.users == {}


def test_adapters_over_a_bf16_base_follow_the_float32_reference(tmp_path) -> None:
    """bf16 weights and compute, the deltas in bf16 too: as tests/models/test_parity_bf16_compute.py, tokens may
    part from the float32 reference only where its top-2 logprobs are within BF16_MARGIN, and until then the top-1
    logprobs stay within BF16_ATOL."""
    base = build_checkpoint(str(tmp_path / "base"), tiny_config("llama"), dtype=torch.bfloat16)
    loras = make_adapters(base, tmp_path)
    llm = LLM(base, dtype="bfloat16", kv_cache_space=0.05, max_num_batched_tokens=64, enable_lora=True, max_loras=4)
    got = run(llm, REQUESTS, loras)
    matched = 0
    for k, ((tokens, tops), out) in enumerate(zip(references(base, loras), got)):
        for step, (token, (ids, vals), lp) in enumerate(zip(out.token_ids, tops, out.logprobs)):
            if token != tokens[step]:
                ref = dict(zip(ids, vals))
                assert token in ref and vals[0] - ref[token] < BF16_MARGIN, f"request {k} step {step}: a clear choice"
                break  # the continuations differ from here on
            assert abs(lp.top[0][1] - vals[0]) < BF16_ATOL, f"request {k} step {step}"
            matched += 1
    assert matched >= 0.75 * STEPS * len(REQUESTS)


def test_adapters_over_an_int8_base_batch_as_they_run_alone(tmp_path) -> None:
    base = build_checkpoint(str(tmp_path / "base"), tiny_config("llama"))
    loras = make_adapters(base, tmp_path)
    llm = LLM(base, dtype="float32", kv_cache_space=0.05, max_num_batched_tokens=64, enable_lora=True, max_loras=4,
              quantization="int8")
    mixed = run(llm, REQUESTS, loras)
    alone = [run(llm, [r], loras)[0] for r in REQUESTS]
    assert [o.token_ids for o in mixed] == [o.token_ids for o in alone]
    assert len({tuple(o.token_ids) for o in mixed[::2]}) == 3
