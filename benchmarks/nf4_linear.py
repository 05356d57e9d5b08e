"""One linear layer, NF4 against dense bf16 and hearth's int4: milliseconds per call at 1 / 8 / 512 rows of x.

    python benchmarks/nf4_linear.py [--rounds 5] [--shape 18944x3584 --shape 4864x896]

Each round times every (variant, rows) once, in turn, so the machine's noise falls on all of them alike; the table
is the median over rounds. Variants: nf4 as dispatch.plan runs it, the codebook kernel and the dequantized-tile GEMM
forced at every row count, dense bf16 in the layout this machine's bf16 models take (bf16 panels), and int4 group 64
as --quantization int4-g64 lays it out.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from hearth.kernels import panels as dense_panels
from hearth.weights import apply, prepare
from hearth.weights.formats import bitsandbytes as bnb


def _time(fn, reps: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e3


def variants(w: torch.Tensor) -> dict[str, object]:
    nf4 = bnb.quantize_nf4(w)
    int4 = prepare.relayout(prepare.pack("float", "int4", w, 64))
    n, k = w.shape
    panels = [dense_panels.pack(w.to(torch.bfloat16), torch.empty(dense_panels.numel(n, k), dtype=torch.bfloat16))]
    rows = [w.shape[0]]
    return {
        "nf4 (plan)": lambda x: apply.linear(x, nf4),
        "nf4 codebook kernel": lambda x: apply.run_codebook(x, nf4, None),
        "nf4 bf16 tiles + GEMM": lambda x: apply.tiled(x, nf4, None),
        "bf16 panels": lambda x: apply.dense_panels_linear(x, panels, rows),
        "int4 g64": lambda x: apply.linear(x, int4),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shape", action="append", help="NxK (default 18944x3584 and 4864x896)")
    ap.add_argument("--rows", default="1,8,512")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in (args.shape or ["18944x3584", "4864x896"])]
    rows = [int(r) for r in args.rows.split(",")]
    print(f"threads {torch.get_num_threads()}, median of {args.rounds} alternated rounds, ms per call")
    for n, k in shapes:
        torch.manual_seed(0)
        w = torch.randn(n, k) * 0.02
        fns = variants(w)
        del w
        xs = {m: torch.randn(m, k).to(torch.bfloat16) for m in rows}
        times: dict[tuple[str, int], list[float]] = {}
        for _ in range(args.rounds):
            for m in rows:
                reps = max(1, int(20 / max(1, m ** 0.5)))
                for name, fn in fns.items():
                    times.setdefault((name, m), []).append(_time(lambda: fn(xs[m]), reps))
        print(f"\nW [{n}, {k}]")
        print(f"{'variant':24s}" + "".join(f"{f'{m} rows':>12s}" for m in rows))
        for name in fns:
            print(f"{name:24s}" + "".join(f"{statistics.median(times[(name, m)]):12.2f}" for m in rows))


if __name__ == "__main__":
    main()
