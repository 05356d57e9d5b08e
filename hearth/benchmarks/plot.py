"""The PNGs of `hearth bench serve --plot` (latency percentiles and throughput against concurrency) and `hearth bench
lab --plot` (TTFT, decode speed and throughput against students, the SLO drawn in)."""
from __future__ import annotations


def require_matplotlib() -> None:
    """Fail before the benchmark runs, not after, when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError("--plot needs matplotlib, which is not installed: pip install matplotlib "
                         "(or drop --plot and use --output-json)") from None


def plot_serve(runs: list[dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["max_concurrency"] for r in runs]
    fig, (ax_lat, ax_itl, ax_tp) = plt.subplots(1, 3, figsize=(15, 4.5))
    for key, label, style in (("ttft_ms_p50", "TTFT p50", "o-"), ("ttft_ms_p99", "TTFT p99", "o--"),
                              ("e2e_s_p50", "end-to-end p50", "s-")):
        ys = [r[key] * (1000 if key.startswith("e2e") else 1) for r in runs]
        ax_lat.plot(xs, ys, style, label=label)
    ax_lat.set(xlabel="max concurrency", ylabel="ms", title="time to first token / end-to-end")
    for key, label, style in (("itl_ms_p50", "inter-token p50", "o-"), ("itl_ms_p99", "inter-token p99", "o--"),
                              ("tpot_ms_p50", "TPOT p50", "s-")):
        ax_itl.plot(xs, [r[key] for r in runs], style, label=label)
    ax_itl.set(xlabel="max concurrency", ylabel="ms", title="inter-token latency")
    ax_tp.plot(xs, [r["output_tok_s"] for r in runs], "o-", label="output tok/s")
    ax_tp.plot(xs, [r["total_tok_s"] for r in runs], "s--", label="total tok/s")
    ax_tp.set(xlabel="max concurrency", ylabel="tokens/s", title="throughput")
    _save(plt, fig, (ax_lat, ax_itl, ax_tp), xs, title, path)


def plot_lab(data: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = data["runs"]
    xs = [r["students"] for r in runs]
    fig, (ax_ttft, ax_dec, ax_tp) = plt.subplots(1, 3, figsize=(15, 4.5))
    ax_ttft.plot(xs, [r["ttft_s_p50"] for r in runs], "o-", label="TTFT p50")
    ax_ttft.plot(xs, [r["ttft_s_p95"] for r in runs], "o--", label="TTFT p95")
    ax_ttft.axhline(data["ttft_slo_s"], color="red", lw=1, label="SLO (p95)")
    ax_ttft.set(xlabel="students", ylabel="s", title="time to first token")
    ax_dec.plot(xs, [r["decode_tok_s_p10"] for r in runs], "o--", label="decode p10 (slowest tenth)")
    ax_dec.plot(xs, [r["decode_tok_s_p50"] for r in runs], "o-", label="decode p50")
    ax_dec.axhline(data["min_decode_tok_s"], color="red", lw=1, label="SLO (p10)")
    ax_dec.set(xlabel="students", ylabel="tokens/s per answer", title="answer streaming speed")
    ax_tp.plot(xs, [r["output_tok_s"] for r in runs], "o-", label="output tok/s, all students")
    ax_tp.set(xlabel="students", ylabel="tokens/s", title="throughput")
    largest = data["largest_holding"]
    _save(plt, fig, (ax_ttft, ax_dec, ax_tp), xs, f"{data['model']}: {data['preamble_len']} + {data['question_len']} "
          f"in / {data['output_len']} out; " + (f"holds {largest} students" if largest else "no level holds"), path)


def _save(plt, fig, axes, xs: list, title: str, path: str) -> None:
    """The panels' shared finish (ticks at the measured levels, grid, legend), the title, the PNG."""
    for ax in axes:
        ax.set_xticks(xs)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"wrote {path}")
