"""The far side of ProcessEngine: an LLMEngine + AsyncEngine in a spawned process, driven over a Pipe with the
typed messages of worker_protocol.py.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from hearth import log_level
from hearth.config import EngineArgs
from hearth.engine import worker_protocol as wp
from hearth.engine.client_options import ClientOptions
from hearth.engine.protocol import EngineInfo

if TYPE_CHECKING:
    from hearth.engine.async_engine import AsyncEngine

logger = logging.getLogger("hearth")

STATS_PERIOD_S = 0.05  # how often a changed stats snapshot is pushed to the front


@dataclass
class WorkerOptions:
    name: str  # the model name metrics carry
    engine_label: str = "0"  # vLLM's `engine` metrics label (the data-parallel rank)
    client: ClientOptions = field(default_factory=ClientOptions)  # the same options as an in-process client


WorkerInfo = EngineInfo  # its name before EngineClient: one info type in process and in a worker


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
            self.send(wp.Outputs(items))


class _SidQueue:
    """Stands in for a stream's asyncio.Queue on the worker side: AsyncEngine calls put_nowait(item)."""

    def __init__(self, outbox: _Outbox, sid: int) -> None:
        self.outbox, self.sid = outbox, sid

    def put_nowait(self, item: object) -> None:
        from hearth.engine.async_engine import END

        self.outbox.put(self.sid, wp.STREAM_END if item is END else item)


def _build_engine(args: EngineArgs):
    """On a thread that then exits, as `hearth serve` does (hearth.engine.build)."""
    from hearth.engine.build import build_engine

    return build_engine(args)


def worker_main(conn: Connection, args: EngineArgs, opts: WorkerOptions) -> None:
    """The spawned process's entry point."""
    logging.basicConfig(level=logging.INFO, format=f"%(levelname)s %(asctime)s [{opts.name}:{opts.engine_label}] "
                        "%(message)s", datefmt="%H:%M:%S")
    log_level.apply(args.debug, args.log_level)  # (args arrive pickled: their __post_init__ ran in the parent)
    try:
        llm = _build_engine(args)
    except BaseException as e:
        conn.send(wp.LoadFailed(f"{type(e).__name__}: {e}" if not isinstance(e, ValueError) else str(e)))
        return
    from hearth.engine.client_options import build_client

    engine = build_client(llm, opts.client, opts.name, opts.engine_label)
    asyncio.run(_serve(conn, engine))


async def _serve(conn: Connection, engine: AsyncEngine) -> None:
    from hearth.engine.async_engine import StreamState

    loop = asyncio.get_running_loop()
    send_lock = threading.Lock()

    def send(msg: wp.ToFront) -> None:
        with send_lock:
            conn.send(msg)

    outbox = _Outbox(send)
    engine.start()
    send(wp.Ready(engine.info))
    inbox: asyncio.Queue[wp.ToWorker] = asyncio.Queue()

    def read() -> None:  # a thread: Connection.recv blocks
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                msg = wp.Shutdown(0.0)  # the front went away: nobody to serve
            loop.call_soon_threadsafe(inbox.put_nowait, msg)
            if isinstance(msg, wp.Shutdown):
                return

    threading.Thread(target=read, name="hearth-worker-recv", daemon=True).start()

    async def accept(sid: int, fut: asyncio.Future) -> None:
        try:
            await fut
            error = None
        except BaseException as e:  # ValueError / QueueFullError / EngineDeadError: the front re-raises it
            error = e
        send(wp.Accepted(sid, error))

    async def check(qid: int, spec) -> None:
        try:
            await engine.check_structured(spec)  # (off the engine thread: the step loop keeps running)
            error = None
        except ValueError as e:
            error = e
        except Exception:  # a hearth bug: the request's own admission reports it
            logger.exception("checking a structured-output constraint failed")
            error = None
        send(wp.StructuredChecked(qid, error))

    async def add_lora(qid: int, lora) -> None:
        try:
            await engine.add_lora(lora)
            error = None
        except Exception as e:  # a LoRAError (a user error) or a bug: the front raises it either way
            error = e
        send(wp.LoRAAdded(qid, error))

    async def push_stats() -> None:
        last = None
        while True:
            s = engine.stats
            if s != last:
                send(wp.Stats(s))
                last = s
            await asyncio.sleep(STATS_PERIOD_S)

    pusher = asyncio.create_task(push_stats())
    while True:
        msg = await inbox.get()
        if isinstance(msg, wp.AddRequests):
            state = StreamState(loop, outbox.queue_for(msg.sid), sum(r.params.n for r in msg.requests))
            asyncio.create_task(accept(msg.sid, engine.submit(msg.requests, state)))
        elif isinstance(msg, wp.AbortRequests):
            engine.abort(msg.request_ids)
        elif isinstance(msg, wp.StopSequences):
            engine.stop(msg.stops)
        elif isinstance(msg, wp.CheckStructured):
            asyncio.create_task(check(msg.qid, msg.spec))
        elif isinstance(msg, wp.AddLoRA):
            asyncio.create_task(add_lora(msg.qid, msg.lora))
        elif isinstance(msg, wp.RemoveLoRA):
            asyncio.create_task(engine.remove_lora(msg.lora_id))
        elif isinstance(msg, wp.RenderMetrics):
            send(wp.Metrics(msg.qid, engine.metrics.render()))
        elif isinstance(msg, wp.Shutdown):
            pusher.cancel()
            await asyncio.to_thread(engine.shutdown, msg.timeout)
            outbox.flush()
            return
