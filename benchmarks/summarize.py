"""The BENCHMARKS.md tables from the JSON files the scripts beside this one write: each case with hearth and its
peer side by side and the ratio (hearth's run before and after the peer's, so a ratio is a range).
usage: python benchmarks/summarize.py [RESULTS_DIR]      (default: ./bench-results, as env.sh)"""
from __future__ import annotations

import glob
import json
import os
import statistics
import sys

VARIANTS = ("q4_0", "q8_0", "bf16")


def _load(path: str) -> dict | list:
    with open(path) as f:
        return json.load(f)


def _values(results: str, pattern: str, key) -> list[float]:
    return [key(_load(p)) for p in sorted(glob.glob(os.path.join(results, pattern)))]


def _cell(hearth: list[float], peer: float | None, fmt: str = "{:.1f}") -> str:
    if not hearth:
        return "-"
    text = " / ".join(fmt.format(v) for v in hearth)
    if peer:
        lo, hi = min(hearth) / peer, max(hearth) / peer
        text += f": {lo:.2f}x" if abs(hi - lo) < 0.005 else f": {lo:.2f}-{hi:.2f}x"
    return text


def offline(results: str) -> None:
    cases = {"n8": ("8 in flight, out tok/s", "output_tok_s"), "n32": ("32 in flight, out tok/s", "output_tok_s"),
             "p512": ("prefill 512, tok/s", "prefill_tok_s"), "p2048": ("prefill 2048, tok/s", "prefill_tok_s")}
    for vllm_path in sorted(glob.glob(os.path.join(results, "offline_vllm_r*.json"))):
        r = vllm_path.rsplit("_r", 1)[1].removesuffix(".json")
        rounds = _load(vllm_path)["rounds"]
        print(f"\n### Offline, round {r}\n")
        print("| case | vLLM-CPU bf16 | " + " | ".join(f"hearth {v.upper()}" for v in VARIANTS) + " |")
        print("|---|---|" + "---|" * len(VARIANTS))
        for case, (label, key) in cases.items():
            peer = statistics.mean(x[case] for x in rounds)
            cells = [_cell(_values(results, f"offline_{v}_r{r}*_{case}.json", lambda d, k=key: d[k]), peer, "{:.0f}")
                     for v in VARIANTS]
            print(f"| {label} | {' / '.join(f'{x[case]:.0f}' for x in rounds)} | " + " | ".join(cells) + " |")


def serve(results: str) -> None:
    for vllm_path in sorted(glob.glob(os.path.join(results, "serve_vllm_r?.json"))):
        r = vllm_path.rsplit("_r", 1)[1].removesuffix(".json")
        peer = _load(vllm_path)["runs"][0]
        print(f"\n### Server, round {r}: 32 requests at concurrency 8\n")
        print("| engine | out tok/s | TTFT p50 ms | start-up s | peak RSS GB |\n|---|---|---|---|---|")
        print(f"| vLLM-CPU bf16 | {peer['output_tok_s']:.1f} | {peer['ttft_ms_p50']:.0f} | "
              f"{_load(vllm_path.replace('.json', '_startup.json'))['startup_s']:.1f} | - |")
        for v in VARIANTS:
            runs = [_load(p) for p in sorted(glob.glob(os.path.join(results, f"serve_{v}_r{r}*.json")))]
            tok = _cell([d["runs"][0]["output_tok_s"] for d in runs], peer["output_tok_s"])
            ttft = _cell([d["runs"][0]["ttft_ms_p50"] for d in runs], peer["ttft_ms_p50"], "{:.0f}")
            up = " / ".join(f"{d['launch']['startup_s']:.1f}" for d in runs)
            rss = " / ".join(f"{d['launch']['peak_rss_mb'] / 1024:.2f}" for d in runs)
            print(f"| hearth {v.upper()} | {tok} | {ttft} | {up} | {rss} |")


def batch1(results: str) -> None:
    paths = sorted(glob.glob(os.path.join(results, "batch1_*_hearth.json")))
    if not paths:
        return
    print("\n### Batch-1 decode, tok/s (16 in / 64 out)\n")
    print("| case | llama.cpp | hearth | ratio |\n|---|---|---|---|")
    for p in paths:
        name = os.path.basename(p).removeprefix("batch1_").removesuffix("_hearth.json")
        bench = [x for x in _load(p.replace("_hearth.json", "_llamacpp.json")) if x.get("n_gen")]
        peer, sd = bench[0]["avg_ts"], bench[0]["stddev_ts"]
        ours = _load(p)["decode_tok_s"]
        print(f"| {name} | {peer:.1f} +- {sd:.1f} | {ours:.1f} | {ours / peer:.2f}x |")


def startup(results: str) -> None:
    rows = {v: _values(results, f"startup_{v}_*.json", lambda d: d["launch"]["startup_s"]) for v in VARIANTS}
    if any(rows.values()):
        print("\n### Start-up to /health, s (TinyLlama-1.1B shape)\n\n| checkpoint | starts |\n|---|---|")
        for v, xs in rows.items():
            print(f"| {v} | {' / '.join(f'{x:.1f}' for x in xs)} |")


if __name__ == "__main__":
    where = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("BENCH_RESULTS", "bench-results")
    for table in (offline, serve, batch1, startup):
        table(where)
