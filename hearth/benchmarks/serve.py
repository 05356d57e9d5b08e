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
import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx

from hearth.benchmarks.common import (
    TokenSampler,
    mean,
    parse_int_list,
    percentile,
    print_grid,
    print_table,
    random_prompts,
    random_text_prompts,
    write_json,
)
from hearth.benchmarks.launch import launched


@dataclass
class RequestResult:
    ok: bool = False
    error: str = ""
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    chunks: int = 0


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (a trailing /v1 is fine)")
    p.add_argument("--model", default=None, help="model name to send (default: the first of GET /v1/models)")
    p.add_argument("--num-prompts", type=int, default=32, help="requests per concurrency level")
    p.add_argument("--max-concurrency", default="8", help="requests in flight; a list like 1,4,8 runs each level")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens (words with --prompt-mode text)")
    p.add_argument("--output-len", type=int, default=64, help="max_tokens, with ignore_eos")
    p.add_argument("--prompt-mode", choices=["token-ids", "text"], default="token-ids",
                   help="send prompts as token-id lists (hearth, vLLM) or as random words (llama-server)")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer folder: draw prompt ids from its vocabulary, skipping special tokens")
    p.add_argument("--token-id-range", default="100:10000",
                   help="LOW:HIGH range of prompt token ids when no --tokenizer is given")
    p.add_argument("--seed", type=int, default=0, help="prompt seed")
    p.add_argument("--warmup", type=int, default=1, help="untimed requests first (short)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per request")
    p.add_argument("--api-key", default=None, help="sent as a Bearer token")
    p.add_argument("--launch", default=None, metavar="COMMAND",
                   help="start this server command first: reports seconds until /health is OK and its peak RSS "
                        "(children included), and stops it afterwards")
    p.add_argument("--launch-timeout", type=float, default=600.0, help="seconds to wait for /health")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="PNG of latency percentiles and throughput against concurrency (needs matplotlib)")


def _root(base_url: str) -> str:
    root = base_url.rstrip("/")
    return root.removesuffix("/v1")


async def _one_request(client: httpx.AsyncClient, url: str, payload: dict) -> RequestResult:
    import httpx

    res = RequestResult()
    t0 = time.perf_counter()
    last = t0
    try:
        async with client.stream("POST", url, json=payload) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")
                res.error = f"HTTP {resp.status_code}: {body[:300]}"
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    res.error = f"stream error: {str(chunk['error'])[:300]}"
                    return res
                now = time.perf_counter()
                if chunk.get("choices"):
                    if res.chunks == 0:
                        res.ttft_s = now - t0
                    else:
                        res.itl_s.append(now - last)
                    last = now
                    res.chunks += 1
                usage = chunk.get("usage")
                if usage:
                    res.output_tokens = usage.get("completion_tokens") or res.output_tokens
                    res.prompt_tokens = usage.get("prompt_tokens", res.prompt_tokens)
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        res.error = f"{type(e).__name__}: {e}"
        return res
    res.e2e_s = time.perf_counter() - t0
    if res.chunks == 0:
        res.error = "the stream ended without any token"
        return res
    res.output_tokens = res.output_tokens or res.chunks
    res.ok = True
    return res


def _payload(model: str, prompt, max_tokens: int) -> dict:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}


async def _run_level(client: httpx.AsyncClient, url: str, model: str, prompts: list, output_len: int,
                     concurrency: int) -> tuple[list[RequestResult], float]:
    sem = asyncio.Semaphore(concurrency)

    async def limited(prompt) -> RequestResult:
        async with sem:
            return await _one_request(client, url, _payload(model, prompt, output_len))

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


def _sampler(ns: argparse.Namespace) -> TokenSampler:
    if ns.tokenizer:
        from hearth.tokenizer import Tokenizer

        return TokenSampler.for_tokenizer(Tokenizer.from_folder(ns.tokenizer))
    try:
        low, high = (int(x) for x in ns.token_id_range.split(":"))
    except ValueError:
        raise ValueError(f"--token-id-range must be LOW:HIGH, got {ns.token_id_range!r}") from None
    return TokenSampler(low, high)


async def _bench(ns: argparse.Namespace, levels: list[int]) -> tuple[str, list[dict]]:
    import httpx  # here: `hearth serve` and every other command import this module to build the CLI

    root = _root(ns.base_url)
    headers = {"Authorization": f"Bearer {ns.api_key}"} if ns.api_key else {}
    limits = httpx.Limits(max_connections=max(levels) + 4, max_keepalive_connections=max(levels) + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(ns.timeout, connect=30.0), limits=limits,
                                 headers=headers) as client:
        model = ns.model
        if model is None:
            resp = await client.get(f"{root}/v1/models")
            resp.raise_for_status()
            model = resp.json()["data"][0]["id"]
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
    ns._sampler = _sampler(ns) if ns.prompt_mode == "token-ids" else None
    launch_info = None
    with launched(ns) as server:
        if server:
            print(f"server up in {server.startup_s:.1f} s (log: {server.log_path})")
        model, runs = asyncio.run(_bench(ns, levels))
    if server:
        launch_info = {"command": ns.launch, "startup_s": server.startup_s,
                       "peak_rss_mb": server.peak_rss_bytes / 2**20, "log": server.log_path}
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
