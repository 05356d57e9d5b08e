"""hearth vs transformers on tiny random checkpoints: greedy tokens identical, top-5 logprobs close."""
import pytest
import torch

from hearth import LLM, SamplingParams, kernels
from tests.tiny_models import build_checkpoint, hf_greedy, tiny_config

STEPS = 32
LOGPROB_ATOL = 2e-3  # float32 both sides; differences come only from summation order
PROMPTS = [[5, 17, 42, 99, 7], [300, 12], list(range(20, 80)), [201, 202, 203, 204, 205, 206, 207, 208, 209]]

CASES = {
    "llama": dict(family="llama"),
    "llama-tied": dict(family="llama", tie_word_embeddings=True),
    "llama-attention-bias": dict(family="llama", attention_bias=True),
    "llama3-rope": dict(family="llama", rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0,
                                                      "original_max_position_embeddings": 32}),
    "llama-linear-rope": dict(family="llama", rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "mistral": dict(family="mistral", sliding_window=None),
    "mistral-sliding": dict(family="mistral", sliding_window=24),
    "qwen2": dict(family="qwen2", use_sliding_window=False),
    # bf16 checkpoint, float32 compute: hearth keeps the weights in bf16 (exact) and widens them in its kernels.
    "llama-bf16-checkpoint": dict(family="llama", ckpt_dtype=torch.bfloat16),
}


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_parity(case: str, tmp_path) -> None:
    kwargs = dict(CASES[case])
    family = kwargs.pop("family")
    ckpt_dtype = kwargs.pop("ckpt_dtype", torch.float32)
    folder = build_checkpoint(str(tmp_path / case), tiny_config(family, **kwargs), dtype=ckpt_dtype)
    expected = hf_greedy(folder, PROMPTS, STEPS)
    llm = LLM(folder, dtype="float32", kv_cache_space=0.05, max_num_batched_tokens=64)
    if ckpt_dtype == torch.bfloat16 and kernels.available():
        assert llm.engine.model.model.layers[0].mlp.down_proj.weight.dtype == torch.bfloat16
    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True, logprobs=5)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    for (hf_tokens, hf_tops), out in zip(expected, outs):
        got = out.outputs[0]
        assert got.token_ids == hf_tokens
        for (hf_ids, hf_vals), lp in zip(hf_tops, got.logprobs):
            ours = dict(lp.top)
            for tok, val in zip(hf_ids, hf_vals):
                if tok in ours:
                    assert abs(ours[tok] - val) < LOGPROB_ATOL
            assert abs(lp.top[0][1] - hf_vals[0]) < LOGPROB_ATOL
