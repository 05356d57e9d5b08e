"""All-reduce of a [rows, hidden] fp32 tensor between 2 tensor-parallel ranks on this host: gloo vs shared memory.

    python benchmarks/tp_allreduce.py [--iters 2000] [--world 2]

Each rank is a spawned process pinned to its own core (as hearth's ranks are); prints the median and p90 microseconds
per all-reduce for each shape and both paths, and checks the shared-memory sum equals gloo's.
"""
from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import socket
import statistics
import time

SHAPES = [(1, 896), (32, 896), (1, 3584), (32, 3584)]


def _rank(rank: int, world: int, port: int, iters: int, buffers, out) -> None:
    import torch
    import torch.distributed as dist

    from hearth.distributed.shm_allreduce import GlooAllReduce, ShmAllReduce

    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=60)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=timeout)
    group = dist.ProcessGroupGloo(store, rank, world, timeout)
    paths = {"gloo": GlooAllReduce(group), "shm": ShmAllReduce(buffers, rank, group, timeout)}
    results = {}
    for rows, hidden in SHAPES:
        x = torch.randn(rows, hidden, generator=torch.Generator().manual_seed(rank))
        sums = {}
        for name, reduce in paths.items():
            y = x.clone()
            reduce(y)
            sums[name] = y
            times = []
            for _ in range(iters):
                y.copy_(x)
                t0 = time.perf_counter()
                reduce(y)
                times.append(time.perf_counter() - t0)
            times.sort()
            results[(rows, hidden, name)] = (statistics.median(times) * 1e6, times[int(0.9 * len(times))] * 1e6)
        assert torch.allclose(sums["gloo"], sums["shm"], rtol=0, atol=1e-6), "shm sum differs from gloo's"
    out.put((rank, results))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--world", type=int, default=2)
    a = ap.parse_args()
    from hearth.distributed.shm_allreduce import SharedBuffers

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    buffers, out = SharedBuffers(a.world), ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, a.world, port, a.iters, buffers, out)) for r in range(a.world)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(30)
    print(f"{'shape':>12} {'gloo med':>9} {'gloo p90':>9} {'shm med':>8} {'shm p90':>8}  (us, rank 0; {a.iters} iters)")
    for rows, hidden in SHAPES:
        g, s = results[0][(rows, hidden, "gloo")], results[0][(rows, hidden, "shm")]
        print(f"{rows:>4}x{hidden:<7} {g[0]:9.1f} {g[1]:9.1f} {s[0]:8.1f} {s[1]:8.1f}   gloo/shm {g[0] / s[0]:.1f}x")


if __name__ == "__main__":
    main()
