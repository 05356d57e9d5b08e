"""LoRA parity: four different random PEFT adapters and the bare base model in ONE batch through hearth, against
transformers with each adapter merged into the weights (peft's merge_and_unload): greedy tokens identical, top-5
logprobs close, for Llama, Qwen2, Qwen3 and Gemma 3. Two adapters and the base get the same long prompt, so a
prefix-cache block shared across adapters would show as wrong tokens. On a quantized (int8) base, each adapter's
tokens in the mixed batch equal its tokens when it runs alone."""
from __future__ import annotations

import pytest

from hearth import LLM, SamplingParams
from hearth.lora.request import LoRARequest
from tests.lora_adapters import build_adapter, merged_model
from tests.tiny_models import build_checkpoint, hf_greedy_loop, tiny_config

STEPS = 24
ATOL = 2e-3  # float32 both sides: the delta's own matmuls vs merged weights differ only in summation order
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


@pytest.mark.parametrize("family", list(FAMILIES))
def test_four_adapters_and_the_base_in_one_batch(family: str, tmp_path) -> None:
    kwargs = dict(FAMILIES[family])
    base = build_checkpoint(str(tmp_path / "base"), tiny_config(kwargs.pop("family"), **kwargs))
    loras = make_adapters(base, tmp_path)
    llm = LLM(base, dtype="float32", kv_cache_space=0.05, max_num_batched_tokens=64, enable_lora=True, max_loras=4,
              max_cpu_loras=4)
    got = run(llm, REQUESTS, loras)
    references = {}
    for k, ((prompt, i), out) in enumerate(zip(REQUESTS, got)):
        if i not in references:
            references[i] = merged_model(base, loras[i].lora_path if i is not None else None)
        tokens, tops = hf_greedy_loop(references[i], prompt, STEPS)
        assert out.token_ids == tokens, f"request {k} (adapter {i}): tokens differ"
        for step, ((ids, vals), lp) in enumerate(zip(tops, out.logprobs)):
            ours = dict(lp.top)
            for tok, val in zip(ids, vals):
                if tok in ours:
                    assert abs(ours[tok] - val) < ATOL, f"request {k} step {step} token {tok}: {ours[tok]} vs {val}"
    assert len({tuple(o.token_ids) for o in got[::2]}) == 3  # the shared prompt: three different continuations
    bm = llm.engine.block_manager
    assert bm.num_used_blocks == 0 and llm.engine.lora.users == {}


def test_adapters_over_an_int8_base_batch_as_they_run_alone(tmp_path) -> None:
    base = build_checkpoint(str(tmp_path / "base"), tiny_config("llama"))
    loras = make_adapters(base, tmp_path)
    llm = LLM(base, dtype="float32", kv_cache_space=0.05, max_num_batched_tokens=64, enable_lora=True, max_loras=4,
              quantization="int8")
    mixed = run(llm, REQUESTS, loras)
    alone = [run(llm, [r], loras)[0] for r in REQUESTS]
    assert [o.token_ids for o in mixed] == [o.token_ids for o in alone]
    assert len({tuple(o.token_ids) for o in mixed[::2]}) == 3
