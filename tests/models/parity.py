"""The parity check every family's test runs: hearth vs transformers on a tiny random checkpoint."""
from __future__ import annotations

from hearth import LLM, SamplingParams
from tests.tiny_models import hf_greedy

# The 60-token prompt crosses the tiny configs' sliding windows (16-24).
PARITY_PROMPTS = [[5, 17, 42, 99, 7], [300, 12], list(range(20, 80)), [201, 202, 203, 204, 205, 206, 207, 208, 209]]


def assert_greedy_parity(folder: str, steps: int = 32, atol: float = 2e-3,
                         prompts: list[list[int]] | None = None, expected=None) -> None:
    """hearth (all prompts concurrently) vs transformers (one at a time), float32 both: greedy tokens equal and
    top-5 logprobs within atol. `expected` replaces the reference (for families transformers runs only as an
    equivalent model, e.g. Baichuan as Llama)."""
    prompts = prompts or PARITY_PROMPTS
    expected = expected or hf_greedy(folder, prompts, steps)
    llm = LLM(folder, dtype="float32", kv_cache_space=0.05, max_num_batched_tokens=64)
    params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True, logprobs=5)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    for i, ((hf_tokens, hf_tops), out) in enumerate(zip(expected, outs)):
        got = out.outputs[0]
        assert got.token_ids == hf_tokens, f"prompt {i}: tokens differ"
        for step, ((hf_ids, hf_vals), lp) in enumerate(zip(hf_tops, got.logprobs)):
            ours = dict(lp.top)
            for tok, val in zip(hf_ids, hf_vals):
                if tok in ours:
                    assert abs(ours[tok] - val) < atol, f"prompt {i} step {step} token {tok}: {ours[tok]} vs {val}"
            assert abs(lp.top[0][1] - hf_vals[0]) < atol
    bm = llm.engine.block_manager
    assert bm.num_used_blocks == 0 and bm.req_blocks == {}, "KV blocks leaked"  # sliding-window releases included
