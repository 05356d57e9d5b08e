"""`hearth bench lab`: how many students a server holds. Each simulated student asks in a closed loop: a streamed
completion of a shared course preamble plus a question of its own, a fixed-length answer (ignore_eos), a random
think time to read it, then the next question. Any OpenAI-compatible server (hearth, vLLM, llama-server).

    hearth bench lab --students 8,16,32 --duration 120 --tokenizer MODEL_DIR [--launch "hearth serve MODEL"]

Students start staggered: student i of N first asks at i/N of --ramp-up, which defaults to the mean think time, so
the first questions spread over one mean reading time, as the students' reading spreads the later ones, instead of
all N arriving at t=0. Every request sent before ramp-up + duration counts (those in flight then are waited for);
aggregate output tok/s is all their tokens over the level's wall time, ramp-up included. A level holds when no
request failed, TTFT p95 <= --ttft-slo and the slowest tenth of answers still stream at >= --min-decode-tps, an
answer's decode speed being (output tokens - 1) / (last chunk - first chunk), tokens as the server's usage counts
them. One untimed request first checks the server and puts the preamble in its prefix cache, so every level starts
alike; the prefix-cache hit rate is read from /metrics (vLLM's counters, as hearth and vLLM expose them).
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import math
import random

from hearth.benchmarks.common import (
    add_client_args,
    async_client,
    completion_payload,
    first_model,
    parse_int_list,
    percentile,
    print_grid,
    print_table,
    server_root,
    stream_completion,
    token_sampler,
    write_json,
)
from hearth.benchmarks.lab_load import Answer, LabPrompts, LevelLoad, hit_rate, prefix_counters, run_level
from hearth.benchmarks.launch import launched


def add_args(p: argparse.ArgumentParser) -> None:
    add_client_args(p)
    p.add_argument("--students", default="8,16,32", help="simulated students; a list like 8,16,32 runs each level")
    p.add_argument("--duration", type=float, default=120.0, help="seconds each level keeps asking, after the ramp-up")
    p.add_argument("--think-time", default="3:10", metavar="LOW:HIGH",
                   help="seconds a student reads an answer before the next question (uniform)")
    p.add_argument("--ramp-up", type=float, default=None, metavar="SECONDS",
                   help="students' first questions spread evenly over this (default: the mean think time)")
    p.add_argument("--preamble-len", type=int, default=250,
                   help="tokens of the course preamble every prompt starts with (words with --prompt-mode text)")
    p.add_argument("--question-len", type=int, default=30,
                   help="tokens of each request's own question after the preamble (words with --prompt-mode text)")
    p.add_argument("--output-len", type=int, default=128, help="tokens per answer: max_tokens, with ignore_eos")
    p.add_argument("--ttft-slo", type=float, default=2.0,
                   help="a level holds when TTFT p95 is at most this (s), and decode p10 >= --min-decode-tps")
    p.add_argument("--min-decode-tps", type=float, default=5.0,
                   help="a level holds when the slowest tenth of answers stream at least this fast (tok/s), "
                        "and TTFT p95 <= --ttft-slo")
    p.add_argument("--seed", type=int, default=0, help="seed of the preamble, the questions and the think times")
    p.add_argument("--warmup", type=int, default=1, help="untimed requests first (short)")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="PNG of TTFT, decode speed and throughput against students (needs matplotlib)")


def _think(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"--think-time must be LOW:HIGH seconds, got {text!r}") from None
    if not 0 <= lo <= hi:
        raise ValueError(f"--think-time needs 0 <= LOW <= HIGH, got {text!r}")
    return lo, hi


def decode_tok_s(a: Answer) -> float | None:
    """(output tokens - 1) / (last chunk - first chunk); None when it cannot be told (all tokens in one chunk)."""
    span = sum(a.result.itl_s)
    if not a.result.ok or a.result.output_tokens < 2 or span <= 0:
        return None
    return (a.result.output_tokens - 1) / span


def summarize_level(load: LevelLoad, answers: list[Answer], wall_s: float, prefix_hit_rate: float | None,
                    ttft_slo: float, min_decode_tps: float) -> dict:
    ok = [a for a in answers if a.result.ok]
    ttft = [a.result.ttft_s for a in ok]
    speeds = [s for s in (decode_tok_s(a) for a in ok) if s is not None]
    out_tokens = sum(a.result.output_tokens for a in ok)
    run = {"students": load.students, "completed": len(ok), "failed": len(answers) - len(ok), "wall_s": wall_s,
           "ttft_s_p50": percentile(ttft, 50), "ttft_s_p95": percentile(ttft, 95),
           "decode_tok_s_p10": percentile(speeds, 10), "decode_tok_s_p50": percentile(speeds, 50),
           "output_tok_s": out_tokens / wall_s if wall_s > 0 else math.nan, "total_output_tokens": out_tokens,
           "prompt_tokens_p50": percentile([a.result.prompt_tokens for a in ok if a.result.prompt_tokens], 50),
           "prefix_cache_hit_rate": prefix_hit_rate}
    why = []
    if run["failed"]:
        why.append(f"{run['failed']} failed")
    if not ok:
        why.append("none completed")
    elif not run["ttft_s_p95"] <= ttft_slo:
        why.append(f"TTFT p95 {run['ttft_s_p95']:.2f} s > {ttft_slo:g} s")
    if ok and not run["decode_tok_s_p10"] >= min_decode_tps:  # (nan when no answer had two timed chunks)
        why.append(f"decode p10 {run['decode_tok_s_p10']:.2f} tok/s < {min_decode_tps:g}")
    run["holds"], run["why_not"] = not why, why
    run["errors"] = sorted({a.result.error for a in answers if not a.result.ok})[:5]
    run["answers"] = [{"student": a.student, "sent_s": round(a.sent_s, 4), "ok": a.result.ok,
                       "ttft_s": a.result.ttft_s, "decode_tok_s": decode_tok_s(a),
                       "output_tokens": a.result.output_tokens, "prompt_tokens": a.result.prompt_tokens,
                       "error": a.result.error or None} for a in answers]
    return run


async def _bench(ns: argparse.Namespace, levels: list[int], think: tuple[float, float],
                 ramp_up: float) -> tuple[str, list[dict]]:
    root = server_root(ns.base_url)
    prompts = LabPrompts(token_sampler(ns), ns.preamble_len, ns.question_len, ns.seed)
    async with async_client(ns, max(levels)) as client:
        model = ns.model or await first_model(client, root)
        url = f"{root}/v1/completions"
        for i in range(ns.warmup):
            res = await stream_completion(client, url, completion_payload(
                model, prompts.ask(random.Random(f"warmup:{ns.seed}:{i}")), min(4, ns.output_len)))
            if not res.ok:
                raise RuntimeError(f"the warm-up request failed: {res.error}")
        runs = []
        for i, n in enumerate(levels):
            load = LevelLoad(n, ns.duration, ramp_up, think, ns.output_len, seed=ns.seed * 1000 + i)
            before = await prefix_counters(client, root)
            answers, wall_s = await run_level(client, url, model, prompts, load)
            rate = hit_rate(before, await prefix_counters(client, root))
            runs.append(summarize_level(load, answers, wall_s, rate, ns.ttft_slo, ns.min_decode_tps))
            _print_level(runs[-1])
        return model, runs


def run(ns: argparse.Namespace) -> dict:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
    levels = parse_int_list(ns.students)
    think = _think(ns.think_time)
    ramp_up = (think[0] + think[1]) / 2 if ns.ramp_up is None else ns.ramp_up
    if ns.duration <= 0 or ramp_up < 0 or ns.preamble_len < 0 or ns.question_len < 1 or ns.output_len < 2:
        raise ValueError("--duration must be > 0, --ramp-up and --preamble-len >= 0, --question-len >= 1 and "
                         "--output-len >= 2 (decode speed needs two tokens)")
    if ns.plot:
        from hearth.benchmarks.plot import require_matplotlib

        require_matplotlib()
    with launched(ns) as server:
        if server:
            print(f"server up in {server.startup_s:.1f} s (log: {server.log_path})")
        model, runs = asyncio.run(_bench(ns, levels, think, ramp_up))
    holding = [r["students"] for r in runs if r["holds"]]
    data = {"mode": "lab", "base_url": ns.base_url, "model": model, "prompt_mode": ns.prompt_mode,
            "preamble_len": ns.preamble_len, "question_len": ns.question_len, "output_len": ns.output_len,
            "think_time_s": list(think), "ramp_up_s": ramp_up, "duration_s": ns.duration, "ttft_slo_s": ns.ttft_slo,
            "min_decode_tok_s": ns.min_decode_tps, "launch": server.summary() if server else None,
            "largest_holding": max(holding) if holding else None, "runs": runs}
    _print(data)
    if ns.output_json:
        write_json(ns.output_json, data)
    if ns.plot:
        from hearth.benchmarks.plot import plot_lab

        plot_lab(data, ns.plot)
    return data


def _print_level(r: dict) -> None:
    """One line as each level ends: a run of several levels takes minutes."""
    verdict = "holds" if r["holds"] else "does not hold: " + "; ".join(r["why_not"])
    print(f"{r['students']} students: {r['completed']} answers, TTFT p95 {r['ttft_s_p95']:.2f} s, decode p10 "
          f"{r['decode_tok_s_p10']:.2f} tok/s: {verdict}", flush=True)


def _print(data: dict) -> None:
    runs = data["runs"]
    header = ["students", "ok", "fail", "TTFT p50 s", "TTFT p95 s", "decode p10", "decode p50", "out tok/s",
              "prefix hit %", "holds"]
    rows = [[r["students"], r["completed"], r["failed"], r["ttft_s_p50"], r["ttft_s_p95"], r["decode_tok_s_p10"],
             r["decode_tok_s_p50"], r["output_tok_s"],
             math.nan if r["prefix_cache_hit_rate"] is None else 100 * r["prefix_cache_hit_rate"],
             "yes" if r["holds"] else "no"] for r in runs]
    think = data["think_time_s"]
    print_grid(f"lab: {data['model']} at {data['base_url']} ({data['preamble_len']} preamble + {data['question_len']} "
               f"question in / {data['output_len']} out, think {think[0]:g}-{think[1]:g} s, ramp-up "
               f"{data['ramp_up_s']:g} s + {data['duration_s']:g} s per level, {data['prompt_mode']}; holds at TTFT "
               f"p95 <= {data['ttft_slo_s']:g} s and decode p10 >= {data['min_decode_tok_s']:g} tok/s)", header, rows)
    if data["launch"]:
        li = data["launch"]
        print_table("launched server", [("start-up to /health s", li["startup_s"]),
                                        ("peak RSS MB (children included)", li["peak_rss_mb"])])
    for r in runs:
        for err in r["errors"]:
            print(f"error ({r['students']} students): {err}")
    largest = data["largest_holding"]
    print(f"largest level that holds: {largest} students" if largest else "no level holds")
