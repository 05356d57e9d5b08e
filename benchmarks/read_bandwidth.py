"""The machine's memory read bandwidth right now: torch sums of a 2 GiB float32 buffer (far past L3) on every
thread, median of N passes, printed and written as JSON. Decode at batch 1 streams every weight once a token, so
weight bytes x tok/s over this is the share of the bandwidth a decode reaches.
usage: python benchmarks/read_bandwidth.py [OUT.json] [PASSES]"""
from __future__ import annotations

import json
import statistics
import sys
import time

import torch

GIB = 1 << 30


def measure(passes: int = 7, nbytes: int = 2 * GIB) -> dict:
    x = torch.ones(nbytes // 4, dtype=torch.float32)  # (written once: every page is resident before timing)
    x.sum()
    rates = []
    for _ in range(passes):
        t0 = time.perf_counter()
        x.sum()
        rates.append(nbytes / (time.perf_counter() - t0) / 1e9)
    return {"read_gb_s_median": statistics.median(rates), "read_gb_s_max": max(rates), "passes": rates,
            "buffer_gib": nbytes / GIB, "threads": torch.get_num_threads()}


if __name__ == "__main__":
    out = measure(int(sys.argv[2]) if len(sys.argv) > 2 else 7)
    print(f"read bandwidth: {out['read_gb_s_median']:.1f} GB/s median, {out['read_gb_s_max']:.1f} max "
          f"({out['threads']} threads, {out['buffer_gib']:.0f} GiB buffer)")
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)
