"""The tensor-parallel all-reduce through shared memory (hearth.distributed.shm_allreduce): 2 spawned ranks sum
tensors over many steps (the two buffers alternating), each rank getting the same floats, with sums past the buffer
through gloo; a dead peer is an error, not a hang."""
from __future__ import annotations

import datetime
import multiprocessing as mp

import pytest
import torch
import torch.distributed as dist

from hearth.distributed.shm_allreduce import SharedBuffers, ShmAllReduce
from hearth.distributed.tensor_parallel import _free_port

SIZES = [1, 10, 64, 65, 200, 64]  # 65, 200: past the 64-float buffers, through gloo
STEPS = 40


def _rank(rank: int, port: int, buffers: SharedBuffers, out) -> None:
    timeout = datetime.timedelta(seconds=30)
    group = dist.ProcessGroupGloo(dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timeout), rank, 2, timeout)
    reduce = ShmAllReduce(buffers, rank, group, timeout)
    got = []
    for step in range(STEPS):
        n = SIZES[step % len(SIZES)]
        y = torch.arange(n, dtype=torch.float32) * (rank + 1) + step
        reduce(y)
        got.append(y.tolist())  # (plain lists: a tensor would go back through a file descriptor)
    out.put((rank, got))


def test_two_ranks_sum_alike_over_many_steps() -> None:
    ctx = mp.get_context("spawn")
    buffers, out, port = SharedBuffers(2, max_numel=64), ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, buffers, out), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(10)
    for step in range(STEPS):
        n = SIZES[step % len(SIZES)]
        want = torch.arange(n, dtype=torch.float32) * 3 + 2 * step
        assert results[0][step] == results[1][step] == want.tolist(), step


def test_a_peer_that_never_comes_is_an_error() -> None:
    buffers = SharedBuffers(2, max_numel=8)
    reduce = ShmAllReduce(buffers, 0, None, datetime.timedelta(seconds=0.2))  # (gloo unused: small sums only)
    with pytest.raises(RuntimeError, match="rank 1 did not reach all-reduce step 1"):
        reduce(torch.ones(4))


def test_a_dead_peer_ends_the_wait_at_once() -> None:
    reduce = ShmAllReduce(SharedBuffers(2, max_numel=8), 0, None, datetime.timedelta(seconds=60), lambda: False)
    with pytest.raises(RuntimeError, match="a tensor-parallel rank died before all-reduce step 1"):
        reduce(torch.ones(4))
