"""`hearth bench latency`: time to first token (prefill) and decode speed of one batch, through LLMEngine.step.

Each iteration adds batch-size fresh random prompts (a new seed per iteration, so the prefix cache never hits),
then steps the engine: steps until every request has its first token are the prefill phase (TTFT), the steps
after are decode. Decode tok/s counts tokens after the first one only. Medians over iterations are reported.
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

from hearth.benchmarks.common import TokenSampler, median, print_table, random_prompts, write_json


@dataclass
class IterResult:
    ttft_s: float  # add_request -> the last request's first token
    decode_s: float  # after that, until every request finished
    decode_steps: int
    step_times_s: list[float]

    def prefill_tok_s(self, batch: int, input_len: int) -> float:
        return batch * input_len / self.ttft_s

    def decode_tok_s(self, batch: int, output_len: int) -> float:
        return batch * (output_len - 1) / self.decode_s if self.decode_s > 0 else float("nan")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input-len", type=int, default=32, help="prompt tokens per request")
    p.add_argument("--output-len", type=int, default=128, help="generated tokens per request (ignore_eos)")
    p.add_argument("--batch-size", type=int, default=1, help="requests run together")
    p.add_argument("--num-iters", type=int, default=3, help="timed iterations (medians are reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed iterations first")


def run_iteration(engine, prompts: list[list[int]], output_len: int, tag: str,
                  on_step: Callable[[], None] | None = None) -> IterResult:
    from hearth.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True, detokenize=False)
    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    pending_first = set(ids)
    t_start = time.perf_counter()
    for rid, prompt in zip(ids, prompts):
        engine.add_request(rid, prompt, params)
    t_first = None
    step_times: list[float] = []
    decode_steps = 0
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        outs = engine.step()
        t1 = time.perf_counter()
        if on_step is not None:
            on_step()
        if t_first is None:
            for o in outs:
                pending_first.discard(o.request_id)
            if not pending_first:
                t_first = t1
        else:
            step_times.append(t1 - t0)
            decode_steps += 1
    t_end = time.perf_counter()
    if t_first is None:
        raise RuntimeError("the engine finished without producing a first token")
    return IterResult(t_first - t_start, t_end - t_first, decode_steps, step_times)


def run(ns: argparse.Namespace) -> dict:
    from hearth.benchmarks.engine_util import build_engine, describe

    if ns.input_len < 1 or ns.output_len < 2:
        raise ValueError("--input-len must be >= 1 and --output-len >= 2 (decode is timed after the first token)")
    if ns.batch_size < 1 or ns.num_iters < 1 or ns.warmup < 0:
        raise ValueError("--batch-size and --num-iters must be >= 1, --warmup >= 0")
    if getattr(ns, "max_num_seqs", None) is not None and ns.max_num_seqs < ns.batch_size:
        ns.max_num_seqs = ns.batch_size  # the batch must run together
    engine, load_s = build_engine(ns)
    sampler = TokenSampler.for_tokenizer(engine.tokenizer, engine.model_config.vocab_size)
    b, n_in, n_out = ns.batch_size, ns.input_len, ns.output_len
    results: list[IterResult] = []
    for it in range(ns.warmup + ns.num_iters):
        prompts = random_prompts(sampler, b, n_in, seed=ns.seed * 1000 + it)
        r = run_iteration(engine, prompts, n_out, tag=f"lat{it}")
        if it >= ns.warmup:
            results.append(r)
    prefill = [r.prefill_tok_s(b, n_in) for r in results]
    decode = [r.decode_tok_s(b, n_out) for r in results]
    tpot = [r.decode_s / r.decode_steps * 1000 for r in results if r.decode_steps]
    data = {
        "mode": "latency",
        **describe(engine, load_s),
        "batch_size": b, "input_len": n_in, "output_len": n_out,
        "num_iters": ns.num_iters, "warmup": ns.warmup,
        "ttft_ms": median([r.ttft_s * 1000 for r in results]),
        "prefill_tok_s": median(prefill),
        "decode_tok_s": median(decode),
        "decode_tok_s_per_seq": median(decode) / b,
        "tpot_ms": median(tpot),
        "e2e_s": median([r.ttft_s + r.decode_s for r in results]),
        "iterations": [{"ttft_ms": r.ttft_s * 1000, "decode_s": r.decode_s, "decode_steps": r.decode_steps,
                        "prefill_tok_s": p, "decode_tok_s": d} for r, p, d in zip(results, prefill, decode)],
    }
    print_table(f"latency: {data['model']} ({data['dtype']}, {data['threads']} threads)", [
        ("batch size", b), ("input / output len", f"{n_in} / {n_out}"), ("iterations (median)", ns.num_iters),
        ("load s", load_s),
        ("TTFT ms", data["ttft_ms"]), ("prefill tok/s", data["prefill_tok_s"]),
        ("decode tok/s (excl. first token)", data["decode_tok_s"]),
        ("decode tok/s per sequence", data["decode_tok_s_per_seq"]),
        ("time per decode step ms", data["tpot_ms"]), ("end-to-end s", data["e2e_s"]),
        ("decode tok/s per iteration", " ".join(f"{d:.1f}" for d in decode)),
    ])
    if ns.output_json:
        write_json(ns.output_json, data)
    return data
