"""hearth's 7B-class rows in one process (a 7B load is minutes on a shared box, so it is paid once): load time,
peak RSS after the load and at the end, prefill of one 512-token prompt, batch-1 decode (median of 3), 8 requests in
flight (end to end, and the decode phase alone).
Writes one JSON; benchmarks/large.sh runs it beside llama.cpp.
usage: python benchmarks/large_hearth.py MODEL OUT.json [--quantization int8|int4] [--decode-len 16]
       [--batch-in 64] [--batch-out 16]"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

from hearth.benchmarks.common import TokenSampler, random_prompts
from hearth.benchmarks.latency import run_iteration
from hearth.config import EngineArgs
from hearth.engine.llm_engine import LLMEngine
from hearth.engine.model_runner import ModelRunner


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # (Linux: KiB)


def weight_bytes(engine: LLMEngine) -> int:
    """Bytes of every tensor the model holds (parameters, buffers, packed weights, panels), each view once."""
    import torch

    seen: set[tuple[int, int]] = set()

    def add(t: object) -> None:
        if isinstance(t, torch.Tensor) and t.numel():
            seen.add((t.data_ptr(), t.numel() * t.element_size()))
        elif isinstance(t, (list, tuple)):
            for x in t:
                add(x)
        elif hasattr(t, "data") and hasattr(t, "scales"):  # a QWeight
            for x in vars(t).values():
                add(x)

    for m in engine.model.modules():
        for name, v in vars(m).items():
            if "kv" not in name:  # (attention layers hold views of the KV cache)
                add(v)
        for t in list(m.parameters(recurse=False)) + list(m.buffers(recurse=False)):
            add(t)
    return sum(n for _, n in seen)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("out")
    p.add_argument("--quantization", default=None)
    p.add_argument("--decode-len", type=int, default=16)
    p.add_argument("--decode-iters", type=int, default=3)
    p.add_argument("--batch-in", type=int, default=64)
    p.add_argument("--batch-out", type=int, default=16)
    ns = p.parse_args()
    if ns.decode_iters < 1 or ns.decode_len < 1 or ns.batch_out < 2:
        p.error("--decode-iters and --decode-len must be >= 1, --batch-out >= 2 (decode is timed after the first token)")
    t0 = time.perf_counter()
    engine = LLMEngine(EngineArgs(model=ns.model, quantization=ns.quantization, max_model_len=1024,
                                  kv_cache_space=0.5, max_num_seqs=8))
    load_s = time.perf_counter() - t0
    rss_load = peak_rss()
    sampler = TokenSampler.for_tokenizer(engine.tokenizer, engine.model_config.vocab_size)
    run_iteration(engine, random_prompts(sampler, 1, 16, seed=1), 4, "warm")  # first-touch of every page
    prefill = run_iteration(engine, random_prompts(sampler, 1, 512, seed=2), 2, "p512")
    decodes = [run_iteration(engine, random_prompts(sampler, 1, 16, seed=3 + i), ns.decode_len + 1, f"b1-{i}")
               for i in range(ns.decode_iters)]
    decode_b1 = statistics.median(d.decode_tok_s(1, ns.decode_len + 1) for d in decodes)
    used = 0

    def track_kv() -> None:
        nonlocal used
        used = max(used, engine.block_manager.num_used_blocks)

    # 8 in flight: end to end (prefill included) and the decode phase alone (from the last request's first token),
    # which is what llama-batched-bench's S_TG reports.
    batch = run_iteration(engine, random_prompts(sampler, 8, ns.batch_in, seed=10), ns.batch_out, "n8", track_kv)
    kv_dtype = engine.runner.kv_caches[0][0].dtype
    per_block = ModelRunner.kv_bytes_per_block(engine.model, engine.args.block_size, kv_dtype)
    data = {"model": ns.model, "quantization": ns.quantization, "load_s": load_s,
            "peak_rss_after_load": rss_load, "peak_rss": peak_rss(), "weight_bytes": weight_bytes(engine),
            "kv_used_bytes": used * per_block, "kv_pool_bytes": engine.cache_config.num_blocks * per_block,
            "prefill512_tok_s": 512 / prefill.ttft_s,
            "decode_b1_tok_s": decode_b1, "decode_b1_iters": [d.decode_tok_s(1, ns.decode_len + 1) for d in decodes],
            "n8_output_tok_s": 8 * ns.batch_out / (batch.ttft_s + batch.decode_s),
            "n8_decode_tok_s": batch.decode_tok_s(8, ns.batch_out), "n8_in": ns.batch_in, "n8_out": ns.batch_out,
            "threads": engine.threads, "pid": os.getpid()}
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in data.items()}))
    with open(ns.out, "w") as f:
        json.dump(data, f, indent=1)


if __name__ == "__main__":
    main()
