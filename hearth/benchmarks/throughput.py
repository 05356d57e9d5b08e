"""`hearth bench throughput`: N fixed-length requests queued at once, the engine runs up to --max-num-seqs together.

Reports total output tok/s and total (prompt + output) tok/s over the wall time from the first add_request to
the last finished token, plus per-request TTFT and end-to-end latency as the engine saw them.
"""
from __future__ import annotations

import argparse
import time

from hearth.benchmarks.common import TokenSampler, mean, percentile, print_table, random_prompts, write_json


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens per request")
    p.add_argument("--output-len", type=int, default=128, help="generated tokens per request (ignore_eos)")
    p.add_argument("--num-prompts", type=int, default=32, help="requests, all queued at the start")
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed warm-up requests first (short: --input-len in, 4 out)")


def _drain(engine, ids: set[str], t_start: float) -> tuple[dict[str, float], dict[str, float], int]:
    first: dict[str, float] = {}
    done: dict[str, float] = {}
    n_out = 0
    while engine.has_unfinished_requests():
        outs = engine.step()
        now = time.perf_counter() - t_start
        for o in outs:
            if o.request_id not in ids:
                continue
            n_out += len(o.new_token_ids)
            first.setdefault(o.request_id, now)
            if o.finished:
                done[o.request_id] = now
    return first, done, n_out


def run(ns: argparse.Namespace) -> dict:
    from hearth.benchmarks.engine_util import build_engine, describe
    from hearth.sampling_params import SamplingParams

    if ns.input_len < 1 or ns.output_len < 1 or ns.num_prompts < 1 or ns.warmup < 0:
        raise ValueError("--input-len, --output-len and --num-prompts must be >= 1, --warmup >= 0")
    engine, load_s = build_engine(ns)
    sampler = TokenSampler.for_tokenizer(engine.tokenizer, engine.model_config.vocab_size)
    if ns.warmup:
        params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, detokenize=False)
        for i, prompt in enumerate(random_prompts(sampler, ns.warmup, ns.input_len, seed=ns.seed * 1000 + 999)):
            engine.add_request(f"warm-{i}", prompt, params)
        while engine.has_unfinished_requests():
            engine.step()

    prompts = random_prompts(sampler, ns.num_prompts, ns.input_len, seed=ns.seed * 1000)
    params = SamplingParams(temperature=0.0, max_tokens=ns.output_len, ignore_eos=True, detokenize=False)
    ids = [f"tp-{i}" for i in range(ns.num_prompts)]
    t_start = time.perf_counter()
    for rid, prompt in zip(ids, prompts):
        engine.add_request(rid, prompt, params)
    first, done, n_out = _drain(engine, set(ids), t_start)
    elapsed = time.perf_counter() - t_start
    n_in = ns.num_prompts * ns.input_len
    ttft = [first[r] * 1000 for r in ids if r in first]
    e2e = [done[r] for r in ids if r in done]
    data = {
        "mode": "throughput",
        **describe(engine, load_s),
        "num_prompts": ns.num_prompts, "input_len": ns.input_len, "output_len": ns.output_len,
        "completed": len(done),
        "elapsed_s": elapsed,
        "total_input_tokens": n_in,
        "total_output_tokens": n_out,
        "requests_per_s": len(done) / elapsed,
        "output_tok_s": n_out / elapsed,
        "total_tok_s": (n_in + n_out) / elapsed,
        "ttft_ms_mean": mean(ttft), "ttft_ms_p50": percentile(ttft, 50), "ttft_ms_p99": percentile(ttft, 99),
        "e2e_s_mean": mean(e2e), "e2e_s_p50": percentile(e2e, 50), "e2e_s_p99": percentile(e2e, 99),
        "num_preemptions": engine.stats().num_preemptions,
    }
    print_table(f"throughput: {data['model']} ({data['dtype']}, {data['threads']} threads)", [
        ("requests x (in / out)", f"{ns.num_prompts} x ({ns.input_len} / {ns.output_len})"),
        ("max in flight (--max-num-seqs)", data["max_num_seqs"]), ("load s", load_s),
        ("elapsed s", elapsed), ("requests/s", data["requests_per_s"]),
        ("output tok/s", data["output_tok_s"]), ("total tok/s", data["total_tok_s"]),
        ("TTFT ms p50 / p99", f"{data['ttft_ms_p50']:.0f} / {data['ttft_ms_p99']:.0f}"),
        ("end-to-end s p50 / p99", f"{data['e2e_s_p50']:.2f} / {data['e2e_s_p99']:.2f}"),
        ("preemptions", data["num_preemptions"]),
    ])
    if ns.output_json:
        write_json(ns.output_json, data)
    return data
