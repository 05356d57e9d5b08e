"""The PNGs in BENCHMARKS.md from figures.json: each case's engines side by side, one bar per round (the mean of the
runs before and after the peer's), whiskers over those runs.
usage: python benchmarks/plot_figures.py      (needs matplotlib; writes benchmarks/plots/*.png)"""
from __future__ import annotations

import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _bars(ax, engines: dict[str, list[list[float]]], title: str) -> None:
    names = list(engines)
    for r in range(2):
        means = [sum(engines[n][r]) / len(engines[n][r]) for n in names]
        lo = [m - min(engines[n][r]) for m, n in zip(means, names)]
        hi = [max(engines[n][r]) - m for m, n in zip(means, names)]
        ax.bar([i + (r - 0.5) * 0.38 for i in range(len(names))], means, 0.38, yerr=[lo, hi], capsize=3,
               label=f"round {r + 1}")
    ax.set_xticks(range(len(names)), [n.replace(" ", "\n", 1) for n in names], fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)


def main() -> None:
    with open(os.path.join(HERE, "figures.json")) as f:
        figures = json.load(f)
    os.makedirs(os.path.join(HERE, "plots"), exist_ok=True)
    cases = figures["offline"]
    fig, axes = plt.subplots(2, 3, figsize=(14, 7.5))
    for ax, (title, engines) in zip(axes.flat, cases.items()):
        _bars(ax, engines, title)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle("Qwen2.5-0.5B shape, 128 in / 64 out: hearth vs vLLM-CPU (2 vCPU Zen 5)")
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "plots", "vs_vllm.png"), dpi=80)
    fig, ax = plt.subplots(figsize=(10, 4))
    _bars(ax, {f"{case}\n{engine}": [[v] for v in values] for case, row in figures["batch1"].items()
               for engine, values in row.items()}, "batch-1 decode tok/s, 16 in / 64 out: hearth vs llama.cpp")
    ax.tick_params(axis="x", labelsize=6)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "plots", "vs_llamacpp.png"), dpi=80)


if __name__ == "__main__":
    main()
