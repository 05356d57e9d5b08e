"""`hearth bench serve`: an async streaming client for any OpenAI-compatible /v1/completions (hearth, vLLM,
llama-server), in the manner of `vllm bench serve`: fixed lengths, ignore_eos, temperature 0, all requests
queued at once and at most --max-concurrency in flight.

Per request: TTFT (send -> first streamed chunk with choices), inter-token latency (gap between successive
chunks), end-to-end latency; output tokens from the final usage chunk when the server sends one, else one
per chunk. With --max-concurrency 1,4,8 the whole run repeats per level (fresh prompts, so the prefix cache
does not carry over).
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx

from hearth.benchmarks.common import (
    RequestResult,
    add_client_args,
    async_client,
    completion_payload,
    first_model,
    mean,
    parse_int_list,
    percentile,
    print_grid,
    print_table,
    random_prompts,
    random_text_prompts,
    server_root,
    stream_completion,
    token_sampler,
    write_json,
)
from hearth.benchmarks.launch import launched


def add_args(p: argparse.ArgumentParser) -> None:
    add_client_args(p)
    p.add_argument("--num-prompts", type=int, default=32, help="requests per concurrency level")
    p.add_argument("--max-concurrency", default="8", help="requests in flight; a list like 1,4,8 runs each level")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens (words with --prompt-mode text)")
    p.add_argument("--output-len", type=int, default=64, help="max_tokens, with ignore_eos")
    p.add_argument("--seed", type=int, default=0, help="prompt seed")
    p.add_argument("--warmup", type=int, default=1, help="untimed requests first (short)")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="PNG of latency percentiles and throughput against concurrency (needs matplotlib)")


async def _run_level(client: httpx.AsyncClient, url: str, model: str, prompts: list, output_len: int,
                     concurrency: int) -> tuple[list[RequestResult], float]:
    sem = asyncio.Semaphore(concurrency)

    async def limited(prompt) -> RequestResult:
        async with sem:
            return await stream_completion(client, url, completion_payload(model, prompt, output_len))

    t0 = time.perf_counter()
    results = await asyncio.gather(*(limited(p) for p in prompts))
    return list(results), time.perf_counter() - t0


def summarize(results: list[RequestResult], duration_s: float, concurrency: int, input_len: int) -> dict:
    ok = [r for r in results if r.ok]
    n_out = sum(r.output_tokens for r in ok)
    n_in = sum(r.prompt_tokens if r.prompt_tokens is not None else input_len for r in ok)
    ttft = [r.ttft_s * 1000 for r in ok]
    itl = [x * 1000 for r in ok for x in r.itl_s]
    tpot = [(r.e2e_s - r.ttft_s) * 1000 / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    e2e = [r.e2e_s for r in ok]
    out = {"max_concurrency": concurrency, "completed": len(ok), "failed": len(results) - len(ok),
           "duration_s": duration_s, "requests_per_s": len(ok) / duration_s,
           "total_input_tokens": n_in, "total_output_tokens": n_out,
           "output_tok_s": n_out / duration_s, "total_tok_s": (n_in + n_out) / duration_s}
    for name, xs in (("ttft_ms", ttft), ("itl_ms", itl), ("tpot_ms", tpot), ("e2e_s", e2e)):
        out[f"{name}_mean"] = mean(xs)
        for q in (50, 90, 99):
            out[f"{name}_p{q}"] = percentile(xs, q)
    out["errors"] = sorted({r.error for r in results if not r.ok})[:5]
    return out


def _make_prompts(ns: argparse.Namespace, num: int, seed: int) -> list:
    if ns.prompt_mode == "text":
        return random_text_prompts(num, ns.input_len, seed)
    return random_prompts(ns._sampler, num, ns.input_len, seed)


async def _bench(ns: argparse.Namespace, levels: list[int]) -> tuple[str, list[dict]]:
    root = server_root(ns.base_url)
    async with async_client(ns, max(levels)) as client:
        model = ns.model or await first_model(client, root)
        url = f"{root}/v1/completions"
        if ns.warmup:
            warm = _make_prompts(ns, ns.warmup, seed=ns.seed * 1000 + 999)
            res, _ = await _run_level(client, url, model, warm, min(4, ns.output_len), ns.warmup)
            bad = [r.error for r in res if not r.ok]
            if bad:
                raise RuntimeError(f"the warm-up request failed: {bad[0]}")
        runs = []
        for i, c in enumerate(levels):
            prompts = _make_prompts(ns, ns.num_prompts, seed=ns.seed * 1000 + i)
            results, duration = await _run_level(client, url, model, prompts, ns.output_len, c)
            runs.append(summarize(results, duration, c, ns.input_len))
        return model, runs


def run(ns: argparse.Namespace) -> dict:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
    levels = parse_int_list(ns.max_concurrency)
    if ns.num_prompts < 1 or ns.input_len < 1 or ns.output_len < 1:
        raise ValueError("--num-prompts, --input-len and --output-len must be >= 1")
    if ns.plot:
        from hearth.benchmarks.plot import require_matplotlib

        require_matplotlib()
    ns._sampler = token_sampler(ns)
    launch_info = None
    with launched(ns) as server:
        if server:
            print(f"server up in {server.startup_s:.1f} s (log: {server.log_path})")
        model, runs = asyncio.run(_bench(ns, levels))
    if server:
        launch_info = server.summary()
    data = {"mode": "serve", "base_url": ns.base_url, "model": model, "prompt_mode": ns.prompt_mode,
            "num_prompts": ns.num_prompts, "input_len": ns.input_len, "output_len": ns.output_len,
            "launch": launch_info, "runs": runs}
    _print(data)
    if ns.output_json:
        write_json(ns.output_json, data)
    if ns.plot:
        from hearth.benchmarks.plot import plot_serve

        plot_serve(runs, ns.plot, f"{model}: {ns.num_prompts} requests, {ns.input_len} in / {ns.output_len} out")
    return data


def _print(data: dict) -> None:
    runs = data["runs"]
    header = ["conc", "ok", "fail", "out tok/s", "total tok/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99",
              "TPOT p50", "e2e p50 s", "e2e p99 s"]
    rows = [[r["max_concurrency"], r["completed"], r["failed"], r["output_tok_s"], r["total_tok_s"],
             r["ttft_ms_p50"], r["ttft_ms_p99"], r["itl_ms_p50"], r["itl_ms_p99"], r["tpot_ms_p50"],
             r["e2e_s_p50"], r["e2e_s_p99"]] for r in runs]
    print_grid(f"serve: {data['model']} at {data['base_url']} ({data['num_prompts']} requests, "
               f"{data['input_len']} in / {data['output_len']} out, {data['prompt_mode']}; latencies in ms)",
               header, rows)
    if data["launch"]:
        li = data["launch"]
        print_table("launched server", [("start-up to /health s", li["startup_s"]),
                                        ("peak RSS MB (children included)", li["peak_rss_mb"])])
    for r in runs:
        for err in r["errors"]:
            print(f"error (concurrency {r['max_concurrency']}): {err}")
