"""The far side of ProcessEngine: an LLMEngine + AsyncEngine in a spawned process, driven over a Pipe.

Messages (pickled tuples) from the front: ("add", sid, subs), ("abort", request_ids), ("stop", [StopRequest]),
("metrics", qid),
("shutdown", timeout). To the front: ("ready", WorkerInfo) or ("load_failed", message), ("accepted", sid, error),
("out", [(sid, list[StepOutput] | "end" | BaseException), ...]) once per engine step, ("stats", EngineStats),
("metrics", qid, bytes).
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Awaitable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from hearth.config import EngineArgs

logger = logging.getLogger("hearth")

STATS_PERIOD_S = 0.05  # how often a changed stats snapshot is pushed to the front


@dataclass
class WorkerOptions:
    name: str  # the model name metrics carry
    engine_label: str = "0"  # vLLM's `engine` metrics label (the data-parallel rank)
    max_waiting_requests: int | None = None
    refill_wait_s: float = 0.0


@dataclass
class WorkerInfo:
    """What the front needs to serve a loaded model without loading it itself."""
    pid: int
    tokenizer: Any  # hearth.tokenizer.Tokenizer (picklable: a tokenizers backend + a dataclass)
    served_model_name: str
    model_path: str
    max_model_len: int
    threads: int
    bound_cores: list[int]
    num_blocks: int
    kv_bytes: int
    weights_bytes: int
    hf_config: Any = None  # hearth.config.HFConfig (a dict): what the serving layer looks up (FIM tokens)
    generation_defaults: dict | None = None  # the engine's generation_config defaults (ServingContext)


class _Outbox:
    """Collects the outputs AsyncEngine posts during one step and sends them in one message (one pipe write per
    step, not per request)."""

    def __init__(self, send) -> None:
        self.send = send
        self.items: list[tuple[int, object]] = []

    def queue_for(self, sid: int) -> _SidQueue:
        return _SidQueue(self, sid)

    def put(self, sid: int, item: object) -> None:
        if not self.items:
            asyncio.get_running_loop().call_soon(self.flush)
        self.items.append((sid, item))

    def flush(self) -> None:
        items, self.items = self.items, []
        if items:
            self.send(("out", items))


class _SidQueue:
    """Stands in for a stream's asyncio.Queue on the worker side: AsyncEngine calls put_nowait(item)."""

    def __init__(self, outbox: _Outbox, sid: int) -> None:
        self.outbox, self.sid = outbox, sid

    def put_nowait(self, item: object) -> None:
        from hearth.engine.async_engine import STREAM_END

        self.outbox.put(self.sid, "end" if item is STREAM_END else item)


def _build_engine(args: EngineArgs):
    """On a thread that then exits, as `hearth serve` does (hearth.engine.build)."""
    from hearth.engine.build import build_engine

    return build_engine(args)


def _weights_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files
                     if f.endswith((".safetensors", ".bin", ".gguf")))
    return total


def worker_main(conn: Connection, args: EngineArgs, opts: WorkerOptions) -> None:
    """The spawned process's entry point."""
    logging.basicConfig(level=logging.INFO, format=f"%(levelname)s %(asctime)s [{opts.name}:{opts.engine_label}] "
                        "%(message)s", datefmt="%H:%M:%S")
    try:
        llm = _build_engine(args)
    except BaseException as e:
        conn.send(("load_failed", f"{type(e).__name__}: {e}" if not isinstance(e, ValueError) else str(e)))
        return
    from hearth.engine.async_engine import AsyncEngine
    from hearth.metrics import ServerMetrics

    mc = llm.model_config
    metrics = ServerMetrics(opts.name, engine=opts.engine_label)
    engine = AsyncEngine(llm, metrics, opts.max_waiting_requests, opts.refill_wait_s)
    bm = llm.block_manager
    info = WorkerInfo(os.getpid(), llm.tokenizer, mc.served_model_name, mc.model, mc.max_model_len, llm.threads,
                      list(llm.bound_cores), bm.num_usable_blocks, _kv_bytes(llm), _weights_bytes(mc.model),
                      mc.hf_config, dict(getattr(llm, "generation_defaults", None) or {}))
    asyncio.run(_serve(conn, engine, info))


def _kv_bytes(llm) -> int:
    import torch

    total = 0
    for obj in getattr(llm.runner, "kv_caches", None) or []:
        for t in obj if isinstance(obj, (list, tuple)) else [obj]:
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


async def _serve(conn: Connection, engine, info: WorkerInfo) -> None:
    from hearth.engine.async_engine import StreamState

    loop = asyncio.get_running_loop()
    send_lock = threading.Lock()

    def send(msg: tuple) -> None:
        with send_lock:
            conn.send(msg)

    outbox = _Outbox(send)
    engine.start()
    send(("ready", info))
    inbox: asyncio.Queue = asyncio.Queue()

    def read() -> None:  # a thread: Connection.recv blocks
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                msg = ("shutdown", 0.0)  # the front went away: nobody to serve
            loop.call_soon_threadsafe(inbox.put_nowait, msg)
            if msg[0] == "shutdown":
                return

    threading.Thread(target=read, name="hearth-worker-recv", daemon=True).start()

    async def accept(sid: int, fut: Awaitable[None]) -> None:
        try:
            await fut
            error = None
        except BaseException as e:  # ValueError / QueueFullError / EngineDeadError: the front re-raises it
            error = e
        send(("accepted", sid, error))

    async def push_stats() -> None:
        last = None
        while True:
            s = engine.stats
            if s != last:
                send(("stats", s))
                last = s
            await asyncio.sleep(STATS_PERIOD_S)

    pusher = asyncio.create_task(push_stats())
    while True:
        msg = await inbox.get()
        kind = msg[0]
        if kind == "add":
            _, sid, subs = msg
            state = StreamState(loop, outbox.queue_for(sid), sum(p.n for _, _, p in subs))
            asyncio.create_task(accept(sid, engine.submit(subs, state)))
        elif kind == "abort":
            engine.abort(msg[1])
        elif kind == "stop":
            engine.stop(msg[1])
        elif kind == "metrics":
            send(("metrics", msg[1], engine.metrics.render()))
        elif kind == "shutdown":
            pusher.cancel()
            await asyncio.to_thread(engine.shutdown, msg[1])
            outbox.flush()
            return
