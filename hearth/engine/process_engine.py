"""ProcessEngine: an engine in its own spawned process behind the EngineClient interface (engine/protocol.py),
plus async load() and render_metrics(). The pipe's messages are worker_protocol.py's.

Why a process: a crash or OOM in one model takes only its process down (its requests fail with WorkerDiedError,
a 503), and unloading a model really returns its memory to the OS (the process exits). The front never imports
model code. NOTE: one reader thread per worker turns pipe messages into event-loop callbacks; all state below is
touched on the event loop only, except _send (locked) which RequestStream.__del__ may call from anywhere.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing as mp
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from hearth.config import EngineArgs

from hearth.engine import worker_protocol as wp
from hearth.engine.async_engine import END, EngineDeadError, RequestStream, StreamState
from hearth.engine.engine_worker import WorkerOptions, worker_main
from hearth.engine.llm_engine import EngineStats
from hearth.engine.output_processor import OutputProcessor, StopRequest
from hearth.engine.protocol import EngineInfo, EngineRequest, engine_requests
from hearth.lora.request import LoRARequest
from hearth.structured.params import StructuredOutputsParams

logger = logging.getLogger("hearth")

_EMPTY_STATS = EngineStats(0, 0, 0.0, 0, 0, 0, 0)


class WorkerDiedError(EngineDeadError):
    """The engine's worker process exited (crash, OOM kill, unload) with this request in flight: a 503."""

    status_code = 503


class NotStartedError(WorkerDiedError):
    """The worker died before it accepted this request: nothing ran or streamed, so another engine may take it."""


class LoadFailedError(RuntimeError):
    """The worker could not load its model (bad path, not enough memory for the KV cache, ...)."""


@dataclass
class _Pending:
    state: StreamState
    request_ids: list[str]
    accepted: asyncio.Future
    num_seqs: int


@dataclass
class _Metrics:
    """What a model's /metrics needs from the front side: the last rendering (a fresh one is asked per scrape)."""
    text: bytes = b""
    waiters: dict[int, asyncio.Future] = field(default_factory=dict)


class ProcessEngine:
    def __init__(self, args: EngineArgs, opts: WorkerOptions, env: dict[str, str] | None = None) -> None:
        self.args, self.opts, self.env = args, opts, env or {}
        self.info: EngineInfo | None = None
        self.metrics = None  # NOTE: None tells server.py's in-process paths there is no local registry
        self.dead: BaseException | None = None
        self.exitcode: int | None = None
        self._stats = _EMPTY_STATS
        self._proc: mp.process.BaseProcess | None = None
        self._conn = None
        self._send_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Future | None = None
        self._streams: dict[int, _Pending] = {}
        self._rid_sid: dict[str, int] = {}
        self._sids = itertools.count()
        self._metrics = _Metrics()
        self._checks: dict[int, asyncio.Future] = {}  # CheckStructured and AddLoRA asks waiting for their answer
        self.in_flight = 0  # sequences submitted and not finished: the data-parallel router's load measure
        self.generated = 0  # output tokens streamed back since the start (the web page's tokens/s)
        self.exited = asyncio.Event()

    # ---- lifecycle ----
    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """AsyncEngine's start(): the process is started by load(); nothing to do here."""

    async def load(self, timeout: float | None = None) -> EngineInfo:
        """Spawn the worker and wait until its model is loaded (up to timeout s; None: until it is loaded or its
        process exits). Raises LoadFailedError / TimeoutError."""
        if self._ready is None:
            self._loop = asyncio.get_running_loop()
            self._ready = self._loop.create_future()
            ctx = mp.get_context("spawn")
            parent, child = ctx.Pipe()
            self._conn = parent
            saved = {k: os.environ.get(k) for k in self.env}
            os.environ.update(self.env)  # NOTE: a spawned child copies os.environ at start; restored just below
            try:
                self._proc = ctx.Process(target=worker_main, args=(child, self.args, self.opts),
                                         name=f"hearth-worker-{self.opts.name}-{self.opts.engine_label}",
                                         daemon=True)
                self._proc.start()
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
            child.close()
            threading.Thread(target=self._read, name="hearth-front-recv", daemon=True).start()
        try:
            return await asyncio.wait_for(asyncio.shield(self._ready), timeout)
        except TimeoutError:
            raise TimeoutError(f"model {self.opts.name!r} did not load within {timeout:.0f} s") from None

    def _read(self) -> None:
        conn, loop = self._conn, self._loop
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            loop.call_soon_threadsafe(self._on_message, msg)
        self._proc.join()
        try:
            loop.call_soon_threadsafe(self._on_exit, self._proc.exitcode)
        except RuntimeError:  # the loop has closed (server shut down)
            pass

    def kill(self) -> None:
        """Stop the worker now (unload, or a stuck shutdown): its in-flight requests fail with a 503."""
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Let the worker's in-flight requests finish (up to timeout), then it exits. Blocking, like AsyncEngine's."""
        if self._proc is None:
            return
        if self._proc.is_alive():
            try:
                self._send(wp.Shutdown(timeout))
            except OSError:
                pass
            self._proc.join(timeout + 5)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(5)

    async def aclose(self, timeout: float = 30.0) -> None:
        await asyncio.to_thread(self.shutdown, timeout)

    @property
    def stats(self) -> EngineStats:
        return self._stats

    # ---- requests ----
    async def generate(self, requests: Sequence[EngineRequest]) -> RequestStream:
        if self.dead is not None:
            raise WorkerDiedError(str(self.dead))
        if self.info is None:
            raise EngineDeadError(f"model {self.opts.name!r} is not loaded")
        requests = engine_requests(requests)
        loop = asyncio.get_running_loop()
        n = sum(r.params.n for r in requests)
        state = StreamState(loop, asyncio.Queue(), n)
        sid = next(self._sids)
        ids = [r.request_id for r in requests]
        pending = _Pending(state, ids, loop.create_future(), n)
        self._streams[sid] = pending
        for rid in ids:
            self._rid_sid[rid] = sid
        self.in_flight += n
        try:
            try:
                self._send(wp.AddRequests(sid, requests))
            except (OSError, ValueError):  # the worker died and the reader thread has not seen it yet
                self._forget(sid)  # before _on_exit runs: it would fail `accepted`, which nobody awaits now
                await self._wait_exited(5.0)
                raise NotStartedError(f"{self.dead or 'the worker process is gone'}; "
                                      "this request had not started: retry it") from None
            try:
                await pending.accepted
            except WorkerDiedError as e:
                raise NotStartedError(str(e)) from None
        except BaseException:
            self._forget(sid)
            if not pending.accepted.done() or pending.accepted.cancelled():
                self._send_quiet(wp.AbortRequests(ids))
            raise
        return RequestStream(self, ids, state, OutputProcessor.for_requests(self.info.tokenizer, requests))

    async def _wait_exited(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self.exited.wait(), timeout)
        except TimeoutError:
            pass

    def abort(self, request_ids: list[str]) -> None:
        self._send_quiet(wp.AbortRequests(list(request_ids)))
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._forget_rids, list(request_ids))
            except RuntimeError:
                pass

    def stop(self, stops: list[StopRequest]) -> None:
        """Finish sequences at the stop strings this front found; the worker answers with their last outputs."""
        self._send_quiet(wp.StopSequences(list(stops)))

    async def check_structured(self, spec: StructuredOutputsParams) -> None:
        """The worker compiles (and caches) the constraint off its engine thread; ValueError if it is bad. A
        worker that is not serving says nothing here: generate() reports that."""
        if self.info is None or self.dead is not None:
            return
        await self._ask(lambda qid: wp.CheckStructured(qid, spec))

    async def add_lora(self, lora: LoRARequest) -> None:
        """The worker reads and adds the adapter; its LoRAError is raised here."""
        if self.info is None or self.dead is not None:
            raise EngineDeadError(f"the engine of {self.opts.name!r} is not running: cannot add LoRA adapter "
                                  f"{lora.lora_name!r}")
        await self._ask(lambda qid: wp.AddLoRA(qid, lora))

    async def _ask(self, message) -> None:
        """Send message(qid) to the worker and wait for its answer to qid: the error it carries is raised here."""
        qid = next(self._sids)
        fut = asyncio.get_running_loop().create_future()
        self._checks[qid] = fut
        self._send_quiet(message(qid))
        try:
            error = await fut
        finally:
            self._checks.pop(qid, None)
        if error is not None:
            raise error

    async def remove_lora(self, lora_id: int) -> None:
        self._send_quiet(wp.RemoveLoRA(lora_id))

    async def render_metrics(self, timeout: float = 5.0) -> bytes:
        """The worker's exposition (its registry carries model_name and engine labels)."""
        if self.info is None or self.dead is not None:
            return self._metrics.text
        qid = next(self._sids)
        fut = asyncio.get_running_loop().create_future()
        self._metrics.waiters[qid] = fut
        self._send_quiet(wp.RenderMetrics(qid))
        try:
            self._metrics.text = await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            pass
        finally:
            self._metrics.waiters.pop(qid, None)
        return self._metrics.text

    # ---- plumbing ----
    def _send(self, msg: wp.ToWorker) -> None:
        with self._send_lock:
            self._conn.send(msg)

    def _send_quiet(self, msg: wp.ToWorker) -> None:
        try:
            if self._conn is not None and self.dead is None:
                self._send(msg)
        except (OSError, ValueError):  # the worker is gone; _on_exit fails what was in flight
            pass

    def _forget(self, sid: int) -> None:
        p = self._streams.pop(sid, None)
        if p is not None:
            self.in_flight -= p.state.remaining if p.accepted.done() else p.num_seqs
            for rid in p.request_ids:
                self._rid_sid.pop(rid, None)

    def _forget_rids(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            sid = self._rid_sid.get(rid)
            if sid is not None:
                self._forget(sid)

    def _on_message(self, msg: wp.ToFront) -> None:
        if isinstance(msg, wp.Outputs):
            for sid, item in msg.items:
                p = self._streams.get(sid)
                if p is None:
                    continue  # aborted meanwhile
                if not p.accepted.done():  # outputs can overtake the worker's Accepted: they mean it was
                    p.accepted.set_result(None)
                if isinstance(item, str):  # wp.STREAM_END, the only text item
                    p.state.queue.put_nowait(END)
                    self._forget(sid)
                elif isinstance(item, BaseException):
                    p.state.queue.put_nowait(item)
                    self._forget(sid)
                else:
                    self.generated += sum(len(o.new_token_ids) for o in item)
                    done = sum(1 for o in item if o.finished)
                    p.state.remaining -= done
                    self.in_flight -= done
                    p.state.queue.put_nowait(item)
        elif isinstance(msg, wp.Accepted):
            p = self._streams.get(msg.sid)
            if p is not None and not p.accepted.done():
                if msg.error is None:
                    p.accepted.set_result(None)
                else:
                    p.accepted.set_exception(msg.error)
        elif isinstance(msg, (wp.StructuredChecked, wp.LoRAAdded)):
            fut = self._checks.get(msg.qid)
            if fut is not None and not fut.done():
                fut.set_result(msg.error)
        elif isinstance(msg, wp.Stats):
            self._stats = msg.stats
        elif isinstance(msg, wp.Metrics):
            fut = self._metrics.waiters.get(msg.qid)
            if fut is not None and not fut.done():
                fut.set_result(msg.text)
        elif isinstance(msg, wp.Ready):
            self.info = msg.info
            if not self._ready.done():
                self._ready.set_result(self.info)
        elif isinstance(msg, wp.LoadFailed):
            self.dead = LoadFailedError(msg.message)
            if not self._ready.done():
                self._ready.set_exception(LoadFailedError(msg.message))

    def _on_exit(self, exitcode: int | None) -> None:
        self.exitcode = exitcode
        how = f"was killed by signal {-exitcode}" if exitcode is not None and exitcode < 0 else \
            f"exited with code {exitcode}"
        reason = f"the worker process of model {self.opts.name!r} (engine {self.opts.engine_label}) {how}"
        if self.dead is None:
            self.dead = WorkerDiedError(reason)
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(LoadFailedError(f"{reason} while loading"))
        for p in list(self._streams.values()):
            err = WorkerDiedError(f"{reason}; this request was in flight: retry it")
            if not p.accepted.done():
                p.accepted.set_exception(err)
            else:
                p.state.queue.put_nowait(err)
        self._streams.clear()
        self._rid_sid.clear()
        self.in_flight = 0
        self._stats = _EMPTY_STATS
        for fut in self._checks.values():  # (their requests fail in generate() now)
            if not fut.done():
                fut.set_result(None)
        for fut in self._metrics.waiters.values():
            if not fut.done():
                fut.set_result(self._metrics.text)
        self.exited.set()
        if exitcode not in (0, None):
            logger.warning("%s", reason)

