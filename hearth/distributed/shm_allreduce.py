"""All-reduce (sum) of an fp32 tensor between the tensor-parallel ranks of one host through shared memory, with
gloo (torch.distributed) for tensors past the buffer (long prompt chunks).

Each rank copies its partial sum into its own slot of a shared buffer, publishes a step counter, waits until every
peer's counter reaches the step, then adds the slots in rank order, so every rank gets the same floats. Two
buffers alternate between steps: a rank writes step s + 1 into the buffer its peers are not reading, and it cannot
reach step s + 2 (the first buffer again) before every peer has published s + 1, which each does only after
reading step s. NOTE: ordering relies on x86's total store order (data stores are seen before the counter's).
"""
from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist

# Floats per rank a shared buffer holds (decode steps and short chunks: [rows, hidden]); larger sums go through gloo.
SHM_MAX_NUMEL = 1 << 19
_FLAG_STRIDE = 16  # int64s between ranks' counters: one 128-byte line each (no false sharing)
_SPINS_BEFORE_YIELD = 2000


class SharedBuffers:
    """The tensors every rank maps (made by rank 0 before it spawns the workers, passed to them as arguments)."""

    def __init__(self, world: int, max_numel: int = SHM_MAX_NUMEL) -> None:
        self.data = torch.zeros(2, world, max_numel).share_memory_()  # [buffer, rank, numel]
        self.flags = torch.zeros(world * _FLAG_STRIDE, dtype=torch.int64).share_memory_()


class GlooAllReduce:
    """Sum over the group through gloo (any size)."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group

    def __call__(self, y: torch.Tensor) -> None:
        self.group.allreduce([y]).wait()


class ShmAllReduce:
    """Sum over the ranks through `buffers` up to its size, gloo past it (both sides choose by size alike)."""

    def __init__(self, buffers: SharedBuffers, rank: int, group: dist.ProcessGroup,
                 timeout: datetime.timedelta, peers_alive: Callable[[], bool] | None = None) -> None:
        self.data, self.rank, self.world = buffers.data, rank, buffers.data.shape[1]
        self.flags = buffers.flags.numpy()  # (a view of the shared counters: reads cost no torch dispatch)
        self.gloo = GlooAllReduce(group)
        self.timeout = timeout.total_seconds()
        self.step = int(self.flags[rank * _FLAG_STRIDE])
        # (a dead peer never publishes its step: checked while waiting, so the wait ends at once, not at timeout)
        self.peers_alive = peers_alive

    def __call__(self, y: torch.Tensor) -> None:
        n = y.numel()
        if n > self.data.shape[2] or y.dtype != torch.float32 or not y.is_contiguous():
            self.gloo(y)
            return
        self.step += 1
        buf = self.data[self.step & 1]
        flat = y.view(-1)
        buf[self.rank, :n].copy_(flat)
        self.flags[self.rank * _FLAG_STRIDE] = self.step
        for r in range(self.world):
            if r != self.rank:
                self._wait(r)
        flat.copy_(buf[0, :n])
        for r in range(1, self.world):
            flat.add_(buf[r, :n])

    def _wait(self, peer: int) -> None:
        flags, at, step = self.flags, peer * _FLAG_STRIDE, self.step
        spins = 0
        while flags[at] < step:
            spins += 1
            if spins >= _SPINS_BEFORE_YIELD:  # (ranks sharing cores: let the peer run)
                os.sched_yield()
                if spins == _SPINS_BEFORE_YIELD:
                    deadline = time.monotonic() + self.timeout
                elif spins % 1024 == 0:
                    if self.peers_alive is not None and not self.peers_alive():
                        raise RuntimeError(f"a tensor-parallel rank died before all-reduce step {step}")
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"tensor-parallel rank {peer} did not reach all-reduce step {step} in "
                                           f"{self.timeout:.0f} s (it died or hangs)")
