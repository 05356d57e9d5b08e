"""Tensor parallelism over torch.distributed's gloo: rank 0 is the engine (scheduler, sampler, KV bookkeeping);
ranks 1..N-1 are worker processes holding their shard (shard.py) and their slice of every layer's KV heads. Each
model forward on rank 0 first sends its flat inputs and attention metadata to the workers over a pipe, then all
ranks run the same forward, meeting at the row-parallel all-reduces (through shared memory, shm_allreduce.py; gloo
for sums past its buffers). Only rank 0 computes logits and samples.

A process group is built directly on a TCPStore (not torch.distributed's default group), so one process may hold
several engines (tests, a draft model later) without global state.
"""
from __future__ import annotations

import dataclasses
import datetime
import logging
import multiprocessing as mp
import os
import pickle
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from hearth import envs
from hearth.distributed.shard import AllReduce, AllReduceStats, Sharder
from hearth.distributed.shm_allreduce import GlooAllReduce, SharedBuffers, ShmAllReduce

if TYPE_CHECKING:
    from hearth.distributed.dp_cores import Topology

logger = logging.getLogger("hearth")

# A collective waits this long for a peer; peers move in lockstep, so only a dead or stuck rank trips it.
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=300)


def rank_threads(threads: int | None, bind: str, rank: int, world: int,
                 topo: Topology | None = None) -> tuple[int, str]:
    """This rank's thread count and binding: one NUMA node per rank where there are several (a multiple of the
    ranks), else the physical cores split evenly (dp_cores.dp_core_sets, shared with --data-parallel-size); a
    '|'-separated --omp-threads-bind gives one list per rank, a single list is split evenly; nobind stays unbound.
    More --threads than the rank's cores: unbound."""
    from hearth.distributed.dp_cores import dp_core_sets
    from hearth.platform import parse_core_list

    bind = (bind or "auto").strip()
    if bind not in ("auto", "nobind") and "|" not in bind:
        cores = parse_core_list(bind)
        per = len(cores) // world
        if per < 1:
            raise ValueError(f"--omp-threads-bind {bind!r} has fewer cores than --tensor-parallel-size {world}")
        return per, ",".join(map(str, cores[rank * per:(rank + 1) * per]))
    try:
        mine = dp_core_sets(world, bind, None, topo, "--tensor-parallel-size")[rank]
    except ValueError:
        if bind != "auto":
            raise
        mine = "nobind"  # more ranks than cores: they share them, unpinned
    if mine == "nobind":
        return threads or max(1, _physical(topo) // world), "nobind"
    cores = parse_core_list(mine)
    if threads is not None and threads > len(cores):
        return threads, "nobind"
    return threads or len(cores), ",".join(map(str, cores[:threads or len(cores)]))


def _physical(topo: Topology | None) -> int:
    from hearth.platform import cpu_info

    return topo.physical if topo is not None else cpu_info().physical_cores


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group(rank: int, world: int, port: int) -> dist.ProcessGroup:
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=COLLECTIVE_TIMEOUT)
    return dist.ProcessGroupGloo(store, rank, world, COLLECTIVE_TIMEOUT)


def _all_reduce(buffers: SharedBuffers | None, rank: int, group: dist.ProcessGroup,
                peers_alive: Callable[[], bool]) -> AllReduce:
    """Shared memory where it was made (HEARTH_TP_SHM_ALLREDUCE, the default), else gloo."""
    if buffers is None:
        return GlooAllReduce(group)
    return ShmAllReduce(buffers, rank, group, COLLECTIVE_TIMEOUT, peers_alive)


def _portable_meta(meta: Any) -> Any:
    """The attention metadata with compact tensor copies (views of preallocated buffers would pickle whole) and
    without its per-step scratch (private fields start empty)."""
    kwargs = {}
    for f in dataclasses.fields(meta):
        if f.name.startswith("_"):
            continue
        value = getattr(meta, f.name)
        kwargs[f.name] = value.clone() if isinstance(value, torch.Tensor) else value
    return type(meta)(**kwargs)


class TensorParallel:
    """Rank 0's side: starts the workers, shards rank 0's model, mirrors its forwards."""

    def __init__(self, args: Any, bind: str, worker_main: Callable[..., None]) -> None:
        """worker_main(args, bind, rank, world, port, buffers, conn): a worker rank's process entry point (the
        engine's: it loads the model through worker_sharder and then calls serve_forwards)."""
        self.world = args.tensor_parallel_size
        if args.speculative_config:
            raise ValueError("speculative decoding is not available with --tensor-parallel-size > 1 yet")
        from hearth.platform import release_calling_thread

        # The workers inherit this thread's core mask when spawned: the process's whole set, not an earlier pin.
        release_calling_thread()
        self.threads, self.bind = rank_threads(args.threads, bind, 0, self.world)
        logger.info("tensor parallel: %d ranks, threads and cores %s", self.world,
                    " | ".join("%d on %s" % rank_threads(args.threads, bind, r, self.world) for r in range(self.world)))
        port = _free_port()
        # (made before the workers: they map the same tensors, handed to them as arguments)
        self.buffers = SharedBuffers(self.world) if envs.tp_shm_allreduce() else None
        ctx = mp.get_context("spawn")  # (a forked copy of a process with OpenMP pools and threads is not safe)
        self.conns, self.procs = [], []
        for rank in range(1, self.world):
            ours, theirs = ctx.Pipe()
            p = ctx.Process(target=worker_main, args=(args, bind, rank, self.world, port, self.buffers, theirs),
                            daemon=True, name=f"hearth-tp{rank}")
            p.start()
            theirs.close()
            self.conns.append(ours)
            self.procs.append(p)
        try:
            self.group = _group(0, self.world, port)
        except BaseException:
            self.close()
            raise
        procs = self.procs
        self.shard = Sharder(0, self.world, _all_reduce(self.buffers, 0, self.group,
                                                        lambda: all(p.is_alive() for p in procs)))  # (load_model's hook: before and after the weights load)
        self.forwards = 0

    @property
    def stats(self) -> AllReduceStats:
        return self.shard.stats

    def attach(self, model: nn.Module, num_blocks: int, block_size: int, kv_dtype: torch.dtype) -> None:
        """Give the workers the KV cache size rank 0 chose, wait for them, then mirror every forward."""
        for c in self.conns:
            c.send((num_blocks, block_size, kv_dtype))
        for c, p in zip(self.conns, self.procs):
            reply = c.recv() if c.poll(COLLECTIVE_TIMEOUT.total_seconds()) else "no answer"
            if reply != "ready":
                self.close()
                raise RuntimeError(f"tensor-parallel worker {p.name} failed to start: {reply}")
        forward: Callable[..., torch.Tensor] = model.forward

        def mirrored(input_ids: torch.Tensor, positions: torch.Tensor, meta: Any) -> torch.Tensor:
            data = pickle.dumps((input_ids.clone(), positions.clone(), _portable_meta(meta)),
                                protocol=pickle.HIGHEST_PROTOCOL)
            for c in self.conns:
                c.send_bytes(data)
            self.forwards += 1
            return forward(input_ids, positions, meta)

        model.forward = mirrored  # NOTE: nn.Module.__call__ dispatches to the instance attribute too

    def all_reduce_per_forward(self) -> float:
        """Seconds in all-reduce per model forward (a decode step is one forward), since the last reset."""
        return self.stats.seconds / self.forwards if self.forwards else 0.0

    def reset_stats(self) -> None:
        self.stats.reset()
        self.forwards = 0

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send_bytes(b"")
            except (OSError, ValueError):
                pass
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        for c in self.conns:
            c.close()
        self.conns, self.procs = [], []


def worker_sharder(args: Any, bind: str, rank: int, world: int, port: int,
                   buffers: SharedBuffers | None) -> Sharder:
    """A worker rank's set-up before it loads the model: its threads and cores, the process group, its all-reduce."""
    from hearth.platform import setup_threads

    setup_threads(*rank_threads(args.threads, bind, rank, world))
    torch.manual_seed(args.seed)
    group = _group(rank, world, port)
    parent = os.getppid()  # (rank 0: when it is gone, this process is re-parented)
    return Sharder(rank, world, _all_reduce(buffers, rank, group, lambda: os.getppid() == parent))


def serve_forwards(model: nn.Module, conn: Any) -> None:
    """A worker rank's loop: run every forward rank 0 sends, until it sends the end or goes away."""
    with torch.inference_mode():
        while True:
            try:
                data = conn.recv_bytes()
            except EOFError:  # rank 0 is gone
                return
            if not data:
                return
            input_ids, positions, meta = pickle.loads(data)
            model.forward(input_ids, positions, meta)
