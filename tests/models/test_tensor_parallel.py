"""Tensor parallelism (2 ranks, 1 thread each, gloo): greedy tokens equal to one rank's on tiny random Llama, Qwen2
and Mixtral checkpoints, in float32 and bfloat16 (partial sums are all-reduced in fp32 and rounded once)."""
from __future__ import annotations

import gc

import pytest

from hearth import LLM, SamplingParams
from tests.tiny_models import build_checkpoint, tiny_config

PROMPTS = ["The quick brown fox", "hello world", "a b c d e f g", "Paris is the capital of"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
ENGINE = dict(threads=1, kv_cache_space=0.05)


def _tokens(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("family, dtype", [("llama", "float32"), ("qwen2", "bfloat16"), ("mixtral", "bfloat16")])
def test_tp2_greedy_equals_tp1(family: str, dtype: str, tmp_path) -> None:
    path = build_checkpoint(str(tmp_path / family), tiny_config(family))
    want = _tokens(LLM(path, dtype=dtype, **ENGINE))
    llm = LLM(path, tensor_parallel_size=2, dtype=dtype, **ENGINE)
    tp = llm.engine.tp
    assert tp is not None and tp.world == 2
    attn = [m for m in llm.engine.model.modules() if type(m).__name__ == "Attention"]
    assert all(a.num_heads == 2 and a.num_kv_heads == 1 for a in attn)  # 4 query / 2 KV heads, halved
    tp.reset_stats()
    assert _tokens(llm) == want
    assert tp.stats.calls == 2 * 2 * tp.forwards  # o_proj + MLP/MoE in each of the 2 layers
    print(f"\n{family}: all-reduce {tp.all_reduce_per_forward() * 1e3:.2f} ms per forward (2 ranks, shared box)")
    procs = list(tp.procs)
    del llm, tp
    gc.collect()
    assert all(not p.is_alive() for p in procs)  # the engine gone, its workers went with it


def test_tp_refuses_quantized_weights(tmp_path) -> None:
    path = build_checkpoint(str(tmp_path / "llama"), tiny_config("llama"))
    with pytest.raises(ValueError, match="needs dense weights"):
        LLM(path, tensor_parallel_size=2, quantization="int8", dtype="float32", **ENGINE)
