"""`hearth bench latency | throughput | serve | lab | soak`: fixed lengths, random token ids, ignore_eos, temperature 0.

    hearth bench latency MODEL --input-len 32 --output-len 128 --batch-size 1 --num-iters 3
    hearth bench throughput MODEL --input-len 128 --output-len 128 --num-prompts 32 --max-num-seqs 8
    hearth bench serve --base-url http://127.0.0.1:8000 --num-prompts 32 --max-concurrency 1,4,8 \\
        --input-len 128 --output-len 64 [--launch "hearth serve MODEL"] [--plot serve.png]
    hearth bench lab --base-url http://127.0.0.1:8000 --students 8,16,32 --duration 120 --tokenizer MODEL_DIR \\
        [--launch "hearth serve MODEL"] [--plot lab.png]

Every mode prints a table; --output-json FILE writes the numbers.
"""
from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    from hearth.benchmarks import lab, latency, serve, soak, throughput
    from hearth.entrypoints.cli import add_engine_args

    p = sub.add_parser("bench", help="benchmark the engine (latency, throughput) or a running server (serve, lab)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = p.add_subparsers(dest="bench_mode", required=True)
    for name, module, helptext, engine in (
            ("latency", latency, "prefill (TTFT) and decode tok/s of one batch, via LLMEngine.step", True),
            ("throughput", throughput, "output and total tok/s with many requests queued at once", True),
            ("serve", serve, "load-test an OpenAI-compatible server with streaming /v1/completions", False),
            ("lab", lab, "how many simulated students a server holds (closed loop, shared preamble, SLO)", False),
            ("soak", soak, "varied load for a long time, the server's RSS sampled (leaks)", False)):
        mp = modes.add_parser(name, help=helptext, description=module.__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
        if engine:
            add_engine_args(mp)
        module.add_args(mp)
        mp.add_argument("--output-json", default=None, metavar="FILE", help="also write the results as JSON")
        mp.set_defaults(func=_exit_code(module.run), bench_run=module.run)


def _exit_code(run):
    """For `hearth bench`: the run returns its results; the CLI wants an exit code and one-line errors."""

    def func(ns: argparse.Namespace) -> int:
        import httpx

        try:
            data = run(ns)
        except (RuntimeError, httpx.HTTPError) as e:
            if ns.bench_mode not in ("serve", "lab", "soak"):  # the engine's own errors keep their traceback
                raise
            print(f"hearth bench {ns.bench_mode}: error: {e}", file=sys.stderr)
            return 1
        runs = data.get("runs", [])
        failed = sum(r["failed"] for r in runs)
        if ns.bench_mode == "lab" and any(r["completed"] for r in runs):
            failed = 0  # requests that fail at a level too high are that level's result (it does not hold)
        if failed:
            print(f"hearth bench {ns.bench_mode}: {failed} requests failed", file=sys.stderr)
            return 1
        return 0

    return func


def build_parser() -> argparse.ArgumentParser:
    """A stand-alone `hearth`-like parser with only the bench command (tests, and `python -m`)."""
    parser = argparse.ArgumentParser(prog="hearth")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Parse `bench MODE ...` and run it; returns the results dict (what --output-json writes)."""
    ns = build_parser().parse_args(argv)
    return ns.bench_run(ns)


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s %(message)s", datefmt="%H:%M:%S")
    ns = build_parser().parse_args()
    try:
        sys.exit(ns.func(ns))
    except ValueError as e:
        print(f"hearth bench {ns.bench_mode}: error: {e}", file=sys.stderr)
        sys.exit(2)
