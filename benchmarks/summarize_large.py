"""The 7B table (benchmarks/large.sh): hearth and llama.cpp per precision, the ratios, and batch-1 decode as a share
of the read bandwidth measured in the same round. usage: python benchmarks/summarize_large.py [RESULTS_DIR]"""
from __future__ import annotations

import glob
import json
import os
import re
import statistics
import sys

PAIRS = {"q4_0": ("q4_0", "int4"), "q8_0": ("q8_0", "int8"), "bf16": ("bf16",)}
GB = 1e9
L = "qwen2.5-7b-shape"


def _json(path: str):
    with open(path) as f:
        return json.load(f)


def _max_rss(err: str) -> float | None:
    """Peak RSS (bytes) from /usr/bin/time -v's report."""
    if not os.path.exists(err):
        return None
    found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(err).read())
    return int(found.group(1)) * 1024 if found else None


def _llamacpp(out: str, v: str, r: str) -> dict:
    row: dict = {}
    bench = os.path.join(out, f"llamacpp_{v}_{r}_bench.json")
    for path in (bench, bench.replace("_bench.json", "_pp.json")):  # (_pp: prefill by another build, large.sh)
        if os.path.exists(path) and os.path.getsize(path):
            for test in _json(path):
                row["prefill" if test["n_prompt"] else "decode"] = test["avg_ts"]
            row["rss"] = max(filter(None, (row.get("rss"), _max_rss(path.replace(".json", ".err")))), default=None)
    batched = os.path.join(out, f"llamacpp_{v}_{r}_batched.jsonl")
    if os.path.exists(batched):
        for line in open(batched):
            if line.startswith("{"):
                d = json.loads(line)
                if d.get("pl") == 8:
                    row["n8"] = d["pl"] * d["tg"] / (d["t_pp"] + d["t_tg"])  # output tok/s, prefill included
                    row["n8_decode"] = d["speed_tg"]  # the decode phase alone
                    row["test_s"] = d["t"]
        # load: the process's wall time less its timed test (llama-batched-bench reports no load time)
        wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)",
                         open(batched.replace(".jsonl", ".err")).read())
        if wall and "test_s" in row:
            secs = 0.0
            for field in wall.group(1).split(":"):
                secs = secs * 60 + float(field)
            row["load"] = secs - row["test_s"]
        row["rss_n8"] = _max_rss(batched.replace(".jsonl", ".err"))
    return row


def _fmt(x: float | None, f: str = "{:.2f}") -> str:
    return "-" if x is None else f.format(x)


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def large(results: str) -> None:
    out = os.path.join(results, "large")
    rounds = sorted({p.rsplit("_", 1)[1][:2] for p in glob.glob(os.path.join(out, "bw_r*.json"))})
    for r in rounds:
        bws = [_json(p)["read_gb_s_median"] for p in sorted(glob.glob(os.path.join(out, f"bw_{r}?.json")))]
        bw = statistics.mean(bws)
        print(f"\n### 7B (Qwen2.5-7B shape), round {r[1:]}: read bandwidth {' / '.join(f'{b:.1f}' for b in bws)} "
              "GB/s (before / after)\n")
        print("| precision | engine | load s | peak RSS GB | weights + KV used GB | prefill 512 tok/s | batch-1 tok/s "
              "| batch-1 x weights / bandwidth | 8 in flight out tok/s | 8 in flight decode tok/s |\n"
              "|---|---|---|---|---|---|---|---|---|---|")
        for v, mine in PAIRS.items():
            peer, earlier = _llamacpp(out, v, r), ""
            if not peer:  # (the bf16 GGUF may be gone by now: llama-bench's row from an earlier run, "r0")
                peer, earlier = _llamacpp(out, v, "r0"), " (earlier run)"
            if peer:
                rss = max(x for x in (peer.get("rss"), peer.get("rss_n8")) if x) if peer.get("rss") else None
                gguf = os.path.join(os.environ.get("BENCH_MODELS", "/work/bench-models"), f"{L}-{v.upper()}.gguf")
                share = (f"{os.path.getsize(gguf) * peer['decode'] / GB / bw:.0%}"
                         if os.path.exists(gguf) and peer.get("decode") else "-")
                print(f"| {v.upper()} | llama.cpp{earlier} | {_fmt(peer.get('load'), '{:.1f}')} | "
                      f"{_fmt(rss and rss / GB)} | - | "
                      f"{_fmt(peer.get('prefill'))} | {_fmt(peer.get('decode'))} | {share} | {_fmt(peer.get('n8'))} | "
                      f"{_fmt(peer.get('n8_decode'))} |")
            for h in mine:
                for p in sorted(glob.glob(os.path.join(out, f"hearth_{h}_{r}?.json"))):
                    d = _json(p)
                    tag = "folder, " + h + " at load" if h.startswith("int") else ("folder" if h == "bf16" else "GGUF")
                    used = (d["weight_bytes"] + d["kv_used_bytes"]) / GB
                    share = d["weight_bytes"] * d["decode_b1_tok_s"] / GB / bw
                    cells = [f"{d[k]:.2f} ({_ratio(d[k], peer.get(key))})"
                             for k, key in (("prefill512_tok_s", "prefill"), ("decode_b1_tok_s", "decode"))]
                    n8 = f"{d['n8_output_tok_s']:.2f} ({_ratio(d['n8_output_tok_s'], peer.get('n8'))})"
                    n8d = (f"{d['n8_decode_tok_s']:.2f} ({_ratio(d['n8_decode_tok_s'], peer.get('n8_decode'))})"
                           if "n8_decode_tok_s" in d else "-")
                    print(f"| {v.upper()} | hearth ({tag}) | {d['load_s']:.1f} | {d['peak_rss'] / GB:.2f} | "
                          f"{used:.2f} | {cells[0]} | {cells[1]} | {share:.0%} | {n8} | {n8d} |")


if __name__ == "__main__":
    large(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("BENCH_RESULTS", "bench-results"))
