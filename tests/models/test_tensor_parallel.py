"""Tensor parallelism (2 ranks, 1 thread each, gloo): greedy tokens equal to one rank's on tiny random Llama, Qwen2
and Mixtral checkpoints, in float32 and bfloat16 (partial sums are all-reduced in fp32 and rounded once), and on
quantized weights (GGUF blocks, --quantization int8, a GPTQ checkpoint)."""
from __future__ import annotations

import gc

import pytest

from hearth import LLM, SamplingParams
from hearth.layers.quant_linear import QuantLinear
from tests import quant_checkpoints as qc
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


def _layers_quantized(llm: LLM) -> int:
    return sum(1 for m in llm.engine.model.modules() if isinstance(m, QuantLinear) and m.qweight is not None)


@pytest.mark.parametrize("case", ["qwen2-gguf-Q4_1", "mixtral-int8", "llama-gptq4-g32"])
def test_tp2_greedy_equals_tp1_on_quantized_weights(case: str, tmp_path) -> None:
    """Quantized layers are cut per rank before packing (hearth.weights.split): the same tokens as one rank."""
    family, kind, *variant = case.split("-")
    cfg = tiny_config(family, **(dict(hidden_size=128, intermediate_size=256) if kind == "gptq4" else {}))
    path, kwargs = build_checkpoint(str(tmp_path / family), cfg), dict(ENGINE, dtype="float32")
    if kind == "gguf":
        path = str(write_gguf_file(path, tmp_path / f"{case}.gguf", variant[0]))
    elif kind == "gptq4":
        qc.write_folder(path, str(tmp_path / "gptq"), str(tmp_path / "deq"), "gptq", 4, 32, sym=False)
        path = str(tmp_path / "gptq")
    else:
        kwargs["quantization"] = kind
    one = LLM(path, **kwargs)
    want, quantized = _tokens(one), _layers_quantized(one)
    del one
    llm = LLM(path, tensor_parallel_size=2, **kwargs)
    dropped = 2 * 2 * 2 if family == "mixtral" else 0  # (2 layers x 2 of the 4 experts x gate_up, down: rank 1's)
    assert _layers_quantized(llm) == quantized - dropped > 0
    assert _tokens(llm) == want


def write_gguf_file(folder: str, path, qtype: str):
    import gguf

    from tests.gguf_writer import write_gguf

    write_gguf(folder, path, gguf.GGMLQuantizationType[qtype])
    return path
