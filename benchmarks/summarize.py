"""BENCHMARKS.md's tables from the JSON files the scripts beside this one write: each case with hearth and its peer
side by side and the ratio, under the machine, date and commit the scripts recorded (meta_*.json).

    python benchmarks/summarize.py [RESULTS_DIR]                          print the tables
    python benchmarks/summarize.py RESULTS_DIR --write BENCHMARKS.md      replace the generated part of the file

RESULTS_DIR defaults to $BENCH_RESULTS or ./bench-results, as env.sh. hearth runs before and after each peer's, so
a ratio against a peer is a range; the before/after table (ab.sh) gives medians and their ratio.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics

VARIANTS = ("q4_0", "q8_0", "bf16")
MODELS = {"qwen2.5-0.5b-shape": "Qwen2.5-0.5B", "tinyllama-1.1b-shape": "TinyLlama-1.1B"}
OFFLINE_CASES = {"n8": ("8 requests in flight, output tok/s", "output_tok_s"),
                 "n32": ("32 requests in flight, output tok/s", "output_tok_s"),
                 "p512": ("Prefill of one 512-token prompt, tok/s", "prefill_tok_s"),
                 "p2048": ("Prefill of one 2048-token prompt, tok/s", "prefill_tok_s")}
AB_CASES = {"b1": ("batch-1 decode tok/s (16 in / 64 out)", "decode_tok_s"),
            "n8": ("8 in flight, output tok/s", "output_tok_s"),
            "n32": ("32 in flight, output tok/s", "output_tok_s"),
            "p512": ("prefill 512, tok/s", "prefill_tok_s")}
LABELS = {"q4_0": "Q4_0", "q8_0": "Q8_0", "bf16": "bf16"}
BEGIN, END = "<!-- summarize.py: begin -->", "<!-- summarize.py: end -->"


def _load(path: str) -> dict | list:
    with open(path) as f:
        return json.load(f)


def _glob(results: str, pattern: str) -> list[str]:
    return sorted(glob.glob(os.path.join(results, pattern)))


def _rounds(results: str, prefix: str) -> list[str]:
    """The round numbers a peer's files exist for, e.g. offline_vllm_r1.json -> '1'."""
    return sorted({m.group(1) for p in _glob(results, f"{prefix}_r*.json")
                   if (m := re.search(r"_r(\d+)\.json$", p))}, key=int)


def _before_after(results: str, head: str, tail: str) -> list[str]:
    """hearth's files of one round, the run before the peer's first: HEAD + before|after + TAIL."""
    return _glob(results, f"{head}before{tail}") + _glob(results, f"{head}after{tail}")


QUIET_LOAD = 0.5  # a run that started above this load average is marked noisy


def _meta(results: str, name: str) -> str:
    path = os.path.join(results, f"meta_{name}.json")
    if not os.path.exists(path):
        return ""
    m = _load(path)
    cpu = f"{m['cpu']}, " if m.get("cpu") else ""
    noisy = (" **Noisy: the machine was not quiet at the start (load average over 0.5); indicative only until "
             "rerun.**" if m["loadavg"] >= QUIET_LOAD else "")
    return (f"Measured {m['date']} at {m['commit']} ({cpu}{m['cpus']} vCPUs, load average {m['loadavg']:.1f} at the "
            f"start).{noisy}")


def _fmt(values: list[float], fmt: str) -> str:
    return " / ".join(fmt.format(v) for v in values) if values else "-"


def _ratio(ours: list[float], peer: float | None) -> str:
    if not ours or not peer:
        return "-"
    lo, hi = min(ours) / peer, max(ours) / peer
    return f"{lo:.2f}x" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}x"


def offline(results: str) -> dict[str, dict[str, list[list[float]]]]:
    """{case label: {engine: [values per round]}}: vLLM's in-process rounds, hearth's runs before and after it."""
    out: dict[str, dict[str, list[list[float]]]] = {}
    for case, (label, key) in OFFLINE_CASES.items():
        rows: dict[str, list[list[float]]] = {"vLLM-CPU bf16": []}
        for r in _rounds(results, "offline_vllm"):
            rows["vLLM-CPU bf16"].append([x[case] for x in _load(
                os.path.join(results, f"offline_vllm_r{r}.json"))["rounds"]])
            for v in VARIANTS:
                rows.setdefault(f"hearth {LABELS[v]}", []).append(
                    [_load(p)[key] for p in _before_after(results, f"offline_{v}_r{r}", f"_{case}.json")])
        if rows["vLLM-CPU bf16"]:
            out[label] = rows
    return out


def _peer_table(rows: dict[str, list[list[float]]], peer: str, fmt: str) -> list[str]:
    n = len(rows[peer])
    lines = ["| engine | " + " | ".join(f"round {i + 1} | vs {peer.split()[0]}" for i in range(n)) + " |",
             "|---|" + "---|---|" * n]
    for engine, per_round in rows.items():
        cells = []
        for i, values in enumerate(per_round):
            cells += [_fmt(values, fmt), _ratio(values, statistics.mean(rows[peer][i]))]
        lines.append(f"| {engine} | " + " | ".join(cells) + " |")
    return lines


def serve(results: str) -> dict[str, list[list[dict]]]:
    """{engine: [[measured run, launch info] per run] per round}, the measured run being the last level."""
    out: dict[str, list[list[dict]]] = {}
    for r in _rounds(results, "serve_vllm"):
        def runs(paths: list[str]) -> list[dict]:
            return [{**d["runs"][-1], **(d["launch"] or {})} for d in map(_load, paths)]
        out.setdefault("vLLM-CPU bf16", []).append(runs(_glob(results, f"serve_vllm_r{r}.json")))
        for v in VARIANTS:
            out.setdefault(f"hearth {LABELS[v]}", []).append(runs(_before_after(results, f"serve_{v}_r{r}", ".json")))
    return out


def _serve_table(rows: dict[str, list[list[dict]]]) -> list[str]:
    peer = rows["vLLM-CPU bf16"]
    lines = ["| engine | round | out tok/s | vs vLLM | TTFT p50 ms | vs vLLM | start-up s | peak RSS GB |",
             "|---|---|---|---|---|---|---|---|"]
    for engine, per_round in rows.items():
        for i, runs in enumerate(per_round):
            tok, ttft = [x["output_tok_s"] for x in runs], [x["ttft_ms_p50"] for x in runs]
            lines.append(f"| {engine if i == 0 else ''} | {i + 1} | {_fmt(tok, '{:.1f}')} | "
                         f"{_ratio(tok, statistics.mean(y['output_tok_s'] for y in peer[i]))} | "
                         f"{_fmt(ttft, '{:.0f}')} | {_ratio(ttft, statistics.mean(y['ttft_ms_p50'] for y in peer[i]))}"
                         f" | {_fmt([x['startup_s'] for x in runs], '{:.1f}')} | "
                         f"{_fmt([x['peak_rss_mb'] / 1024 for x in runs], '{:.2f}')} |")
    return lines


def batch1(results: str) -> dict[str, dict[str, list[float]]]:
    """{case: {"llama.cpp": [mean per round], "llama.cpp sd": [...], "hearth": [median per round]}}."""
    out: dict[str, dict[str, list[float]]] = {}
    for p in _glob(results, "batch1_*_hearth.json"):
        m = re.match(r"batch1_(.+)_(bf16|q\d_\d)_r(\d+)_hearth\.json$", os.path.basename(p))
        if not m:
            continue
        case = out.setdefault(f"{MODELS.get(m.group(1), m.group(1))} {LABELS[m.group(2)]}",
                              {"llama.cpp": [], "llama.cpp sd": [], "hearth": []})
        bench = [x for x in _load(p.replace("_hearth.json", "_llamacpp.json")) if x.get("n_gen")]
        case["llama.cpp"].append(bench[0]["avg_ts"])
        case["llama.cpp sd"].append(bench[0]["stddev_ts"])
        case["hearth"].append(_load(p)["decode_tok_s"])
    return out


def _batch1_table(rows: dict[str, dict[str, list[float]]]) -> list[str]:
    lines = ["| case | llama.cpp, per round | hearth, per round | hearth / llama.cpp |", "|---|---|---|---|"]
    for case, row in rows.items():
        peer = " / ".join(f"{a:.1f} +- {s:.1f}" for a, s in zip(row["llama.cpp"], row["llama.cpp sd"]))
        ratios = " / ".join(f"{h / p:.2f}x" for h, p in zip(row["hearth"], row["llama.cpp"]))
        lines.append(f"| {case} | {peer} | {_fmt(row['hearth'], '{:.1f}')} | {ratios} |")
    return lines


def startup(results: str) -> dict[str, list[float]]:
    rows = {v: [_load(p)["launch"]["startup_s"] for p in _glob(results, f"startup_{v}_*.json")] for v in VARIANTS}
    return {v: xs for v, xs in rows.items() if xs}


def ab(results: str) -> dict[str, dict[str, list[float]]]:
    """{row label: {"before": [per round], "after": [per round]}} from ab.sh's files."""
    out: dict[str, dict[str, list[float]]] = {}
    for v in ("bf16", "q4_0"):
        for case, (label, key) in AB_CASES.items():
            sides = {side: [_load(p)[key] for p in sorted(_glob(results, f"ab_{v}_{side}_r*_{case}.json"),
                                                         key=lambda p: int(re.search(r"_r(\d+)_", p).group(1)))]
                     for side in ("before", "after")}
            if sides["before"] or sides["after"]:
                out[f"{'bf16 folder' if v == 'bf16' else 'Q4_0 GGUF'}: {label}"] = sides
    return out


def _ab_table(rows: dict[str, dict[str, list[float]]]) -> list[str]:
    lines = ["| row | before, per round | after, per round | median before | median after | after / before |"
             " pairs |", "|---|---|---|---|---|---|---|"]
    for label, s in rows.items():
        b, a = s["before"], s["after"]
        if not (a and b):
            continue
        pairs = [x / y for x, y in zip(a, b)]
        lines.append(f"| {label} | {_fmt(b, '{:.1f}')} | {_fmt(a, '{:.1f}')} | {statistics.median(b):.1f} | "
                     f"{statistics.median(a):.1f} | **{statistics.median(a) / statistics.median(b):.2f}x** | "
                     f"{min(pairs):.2f}-{max(pairs):.2f}x |")
    return lines


AVX2_CASES = {"b1": ("batch-1 decode tok/s (16 in / 64 out)", "decode_tok_s"),
              "n8": ("8 in flight, decode tok/s (128 in / 64 out)", "decode_tok_s"),
              "n32": ("32 in flight, decode tok/s (128 in / 64 out)", "decode_tok_s"),
              "p512": ("prefill 512, tok/s", "prefill_tok_s"),
              "tl_b1": ("TinyLlama shape Q8_0, batch-1 decode tok/s (16 in / 32 out)", "decode_tok_s"),
              "tl_n8": ("TinyLlama shape Q8_0, 8 in flight, decode tok/s (128 in / 32 out)", "decode_tok_s")}


def _llama_avx2(results: str, r: str) -> dict[str, float]:
    """llama.cpp's figures of round r: llama-bench's tg64 and pp512, llama-batched-bench's S_TG at 8 and 32."""
    out: dict[str, float] = {}
    for model in ("", "tl_"):  # the Qwen2.5 Q4_0 files, then TinyLlama Q8_0's (absent in older result sets)
        bench = os.path.join(results, f"avx2_llama_r{r}_{model}bench.json")
        if not os.path.exists(bench):
            continue
        for x in _load(bench):
            if x.get("n_gen"):
                out[f"{model}b1"] = x["avg_ts"]
            elif x.get("n_prompt") == 512:
                out[f"{model}p512"] = x["avg_ts"]
        with open(os.path.join(results, f"avx2_llama_r{r}_{model}batched.jsonl")) as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    out[f"{model}n{row['pl']}"] = row["speed_tg"]
    return out


def avx2(results: str) -> dict[str, dict[str, list[float]]]:
    """{case: {"hearth": [per round], "llama.cpp": [per round]}} from avx2.sh's files."""
    rounds = sorted({m.group(1) for p in _glob(results, "avx2_hearth_r*_b1.json")
                     if (m := re.search(r"_r(\d+)_", p))}, key=int)
    out: dict[str, dict[str, list[float]]] = {}
    for r in rounds:
        peer = _llama_avx2(results, r)
        for case, (label, key) in AVX2_CASES.items():
            if case not in peer:
                continue
            row = out.setdefault(label, {"hearth": [], "llama.cpp": []})
            row["hearth"].append(_load(os.path.join(results, f"avx2_hearth_r{r}_{case}.json"))[key])
            row["llama.cpp"].append(peer[case])
    return out


def _avx2_forced(results: str) -> bool:
    """Whether avx2.sh ran hearth in forced AVX2 mode (an AVX-512 host), from the ISA line it records."""
    path = os.path.join(results, "avx2_isa.txt")
    return not os.path.exists(path) or "HEARTH_KERNELS_ISA=avx2" in open(path).read()


def _avx2_table(rows: dict[str, dict[str, list[float]]], forced: bool = True) -> list[str]:
    side = "hearth (forced AVX2)" if forced else "hearth"
    lines = [f"| case | llama.cpp (AVX2 build), per round | {side}, per round | hearth / llama.cpp, "
             "per round | median ratio |", "|---|---|---|---|---|"]
    for label, row in rows.items():
        ratios = [h / p for h, p in zip(row["hearth"], row["llama.cpp"])]
        lines.append(f"| {label} | {_fmt(row['llama.cpp'], '{:.1f}')} | {_fmt(row['hearth'], '{:.1f}')} | "
                     f"{_fmt(ratios, '{:.2f}x')} | **{statistics.median(ratios):.2f}x** |")
    return lines


LAB_SERVERS = {"hearth": "hearth", "llama": "llama-server"}


def lab(results: str) -> dict[tuple[str, int], list[dict]]:
    """{(server, students): [that level's run, per round]} from lab.sh's files (lab_<server>_q4_0_r<N>.json)."""
    out: dict[tuple[str, int], list[dict]] = {}
    for path in sorted(_glob(results, "lab_*_q4_0_r*.json"), key=lambda p: int(re.search(r"_r(\d+)\.json", p)[1])):
        server = LAB_SERVERS[os.path.basename(path).split("_")[1]]
        for run in _load(path)["runs"]:
            out.setdefault((server, run["students"]), []).append(run)
    return out


def _lab_table(rows: dict[tuple[str, int], list[dict]]) -> list[str]:
    lines = ["| server | students | TTFT p95 s, per round | slowest tenth's decode tok/s, per round | output tok/s, "
             "per round | holds |", "|---|---|---|---|---|---|"]
    for (server, students), runs in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        held = [r["holds"] for r in runs]
        lines.append(f"| {server} | {students} | {_fmt([r['ttft_s_p95'] for r in runs], '{:.2f}')} | "
                     f"{_fmt([r['decode_tok_s_p10'] for r in runs], '{:.2f}')} | "
                     f"{_fmt([r['output_tok_s'] for r in runs], '{:.1f}')} | "
                     f"{'yes' if all(held) else 'no' if not any(held) else 'in some rounds'} |")
    return lines


def render(results: str) -> list[str]:
    """The generated part of BENCHMARKS.md: one table per case, each under the meta line of the script behind it."""
    lines: list[str] = []
    if cases := offline(results):
        lines += ["## Against vLLM-CPU (Qwen2.5-0.5B shape, 128 in / 64 out, all requests queued at once)", "",
                  "![hearth vs vLLM-CPU](benchmarks/plots/vs_vllm.png)", "",
                  f"`benchmarks/offline.sh`. {_meta(results, 'offline')} vLLM's values are its two in-process "
                  "rounds; hearth's its runs before / after vLLM; the ratio is hearth over the mean of vLLM's two.",
                  ""]
        for label, rows in cases.items():
            lines += [f"**{label}**", "", *_peer_table(rows, "vLLM-CPU bf16", "{:.0f}"), ""]
    if rows := serve(results):
        lines += ["**Server: 32 requests at concurrency 8, 128 in / 64 out, streaming**", "",
                  f"`benchmarks/serve.sh`. {_meta(results, 'serve')} The same client, `hearth bench serve "
                  "--launch`, for both: start-up is launch to the first 200 from /health, peak RSS includes child "
                  "processes, and an untimed pass of the same load runs first.", "", *_serve_table(rows), ""]
    if rows := batch1(results):
        lines += ["## Against llama.cpp: batch-1 decode (16 in / 64 out), tok/s", "",
                  "![hearth vs llama.cpp](benchmarks/plots/vs_llamacpp.png)", "",
                  f"`benchmarks/batch1.sh`. {_meta(results, 'batch1')} llama.cpp: `llama-bench -n 64 -r 3` (mean +- "
                  "sd); hearth: `hearth bench latency`, median of 3, on the same GGUF (the bf16 folder for bf16). "
                  "Each pair back to back.", "", *_batch1_table(rows), ""]
    if rows := startup(results):
        lines += ["## Start-up (TinyLlama-1.1B shape, `hearth serve` to the first 200 from /health)", "",
                  f"`benchmarks/startup.sh`. {_meta(results, 'startup')}", "", "| checkpoint | starts, s |",
                  "|---|---|", *(f"| {'bf16 folder' if v == 'bf16' else v.upper() + ' GGUF'} | {_fmt(xs, '{:.1f}')} |"
                                 for v, xs in rows.items()), ""]
    if rows := avx2(results):
        if _avx2_forced(results):
            title, how = ("hearth in forced AVX2 mode against an AVX2-only llama.cpp", "An AVX-512 host with "
                          "HEARTH_KERNELS_ISA=avx2 (hearth's kernels, dispatch and torch's kernels held to AVX2) "
                          "against a llama.cpp built with GGML_NATIVE=OFF, AVX2 on, AVX-512 / VNNI / AMX off")
        else:
            title, how = ("hearth against llama.cpp on an AVX2-only CPU", "A CPU without AVX-512 or VNNI: both "
                          "natively (llama.cpp's GGML_NATIVE build)")
        lines += [f"## AVX2: {title} (issue 55)", "",
                  f"`benchmarks/avx2.sh`, Qwen2.5-0.5B shape Q4_0 (its tied head Q8_0, as llama-quantize writes "
                  f"it) and TinyLlama-1.1B shape Q8_0, the same GGUFs on both sides, 2 threads. "
                  f"{_meta(results, 'avx2')} {how}; the two alternate, a round each. "
                  "Decode at N in flight: `hearth bench latency --batch-size N` against llama-batched-bench's S_TG.",
                  "", *_avx2_table(rows, _avx2_forced(results)), ""]
    if rows := lab(results):
        lines += ["## The school lab: how many students two cores hold (issue 55)", "",
                  f"`benchmarks/lab.sh`, Qwen2.5-0.5B shape Q4_0 GGUF, `hearth bench lab` against both servers: each "
                  "simulated student asks a shared 250-word course preamble plus a 30-word question of its own "
                  "(about 500 tokens), reads the 128-token answer for 3-10 s, asks again; a level holds when TTFT p95 "
                  "<= 2 s and the slowest tenth of answers stream at >= 5 tok/s. Both get the same text prompts; "
                  f"llama-server one slot per student. {_meta(results, 'lab')} The two alternate, a round each.", "",
                  *_lab_table(rows), ""]
    if rows := ab(results):
        lines += ["## Before / after (issue 43, architecture step 2: one engine client, token ids only in the engine, "
                  "configuration declared once)", "",
                  "![before / after](benchmarks/plots/before_after.png)", "",
                  f"`benchmarks/ab.sh`, Qwen2.5-0.5B shape. Before: {_meta(results, 'ab_before')} After: "
                  f"{_meta(results, 'ab_after')} The two checkouts alternate ABBA, one round each.", "",
                  *_ab_table(rows), ""]
    return lines


def write(path: str, lines: list[str]) -> None:
    """Replace what lies between the BEGIN and END markers of PATH."""
    with open(path) as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"summarize.py: {path} has no '{BEGIN}' ... '{END}' markers; add them where the tables go")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    with open(path, "w") as f:
        f.write(head + BEGIN + "\n\n" + "\n".join(lines) + "\n" + END + tail)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="?", default=os.environ.get("BENCH_RESULTS", "bench-results"))
    ap.add_argument("--write", metavar="FILE", help="replace the generated part of FILE (BENCHMARKS.md)")
    ns = ap.parse_args()
    lines = render(ns.results)
    if ns.write:
        write(ns.write, lines)
    else:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
