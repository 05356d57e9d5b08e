"""AsyncEngine: the LLMEngine in one background thread; one asyncio stream per HTTP request.

NOTE: LLMEngine is not thread-safe. Only the engine thread calls it. The event loop talks to it through a
command list (add / abort) guarded by a Condition; the engine thread drains it between steps and sleeps on the
Condition when idle (no busy loop). Results go back through each stream's asyncio.Queue via
loop.call_soon_threadsafe, so the event loop never blocks on the model.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from hearth import heap
from hearth.engine.llm_engine import EngineStats, LLMEngine
from hearth.engine.output_processor import OutputProcessor, StopRequest
from hearth.engine.outputs import StepOutput
from hearth.engine.protocol import EngineClient, EngineInfo, EngineRequest, engine_requests
from hearth.engine.request import Request
from hearth.lora.request import LoRARequest
from hearth.metrics import ServerMetrics
from hearth.platform import bind_omp_threads, release_calling_thread
from hearth.structured.compiler import CompiledGrammar
from hearth.structured.params import StructuredOutputsParams

logger = logging.getLogger("hearth")

END = object()  # queued after a stream's last output (ProcessEngine and the worker post it too)


class QueueFullError(Exception):
    """The waiting queue is over --max-waiting-requests: the client should retry later."""

    retry_after = 1


class EngineDeadError(RuntimeError):
    """The engine loop crashed (a hearth bug, never a user error)."""


class ShutdownError(RuntimeError):
    """The server shut down before this request finished (its drain deadline passed)."""


@dataclass
class StreamState:
    """One stream's queue as the engine side sees it (a worker gives a queue that pipes items to the front)."""
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    remaining: int  # sequences not yet finished, over all the stream's requests

    def post(self, item: object) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


@dataclass
class _Track:
    """Engine-thread bookkeeping of one engine request (all its n sequences), for the stream and the metrics."""

    state: StreamState
    arrival: float
    requests: list[Request]
    n_left: int
    first_token: float | None = None
    last_token: dict[int, float] = field(default_factory=dict)
    generated: int = 0  # tokens of all n sequences so far


@dataclass
class AddCommand:
    """Queued for the engine thread: admit these requests into one stream; `accepted` answers (None or the error)."""
    requests: list[EngineRequest]
    grammars: list[CompiledGrammar | None]  # each request's constraint, compiled off the engine thread
    state: StreamState
    accepted: asyncio.Future
    arrival: float


@dataclass
class AbortCommand:
    request_ids: list[str]


@dataclass
class CallCommand:
    """Queued for the engine thread: run `call` there (it touches engine state); `done` answers its result or error."""
    call: Callable[[], object]
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future


@dataclass
class StopCommand:
    """Queued for the engine thread: finish these sequences at the stop strings the front found in their text."""
    stops: list[StopRequest]


class RequestStream:
    """The outputs of one HTTP request's engine requests (several for a list of prompts), in step order.

    Iterate it to get StepOutputs until every sequence has finished. abort() is idempotent and safe after the end.
    """

    def __init__(self, engine: EngineClient, request_ids: list[str], state: StreamState,
                 processor: OutputProcessor) -> None:
        self.engine = engine
        self.request_ids = request_ids
        self._state = state
        self._processor = processor  # text and stop strings, on the reader's side
        self.finished = False  # the last output arrived, or aborted
        self.aborted = False

    def __aiter__(self) -> AsyncIterator[StepOutput]:
        return self._iter()

    async def _iter(self) -> AsyncIterator[StepOutput]:
        while True:
            item = await self._state.queue.get()
            if item is END:
                self.finished = True
                return
            if isinstance(item, BaseException):
                self.finished = True
                raise item
            outputs = self._processor.process(item)
            if self._processor.to_stop:
                self.engine.stop(self._processor.to_stop)
                self._processor.to_stop = []
            for out in outputs:
                yield out
            if self._processor.num_unfinished == 0:  # (the last may have ended at a stop string, here)
                self.finished = True
                return

    def __del__(self) -> None:
        # NOTE: safety net for a response that never started iterating (client gone before the first byte).
        if not self.finished:
            self.engine.abort(self.request_ids)

    def fail(self, error: BaseException) -> None:
        """Call on the event loop. Ends iteration with `error` raised to the consumer; frees the engine's blocks."""
        if not self.finished:
            self.finished = True
            self.engine.abort(self.request_ids)
            self._state.queue.put_nowait(error)

    def abort(self) -> None:
        """Call on the event loop. Ends iteration (a waiting consumer wakes up) and frees the engine's blocks."""
        if not self.finished:
            self.finished = self.aborted = True
            self.engine.abort(self.request_ids)
            self._state.queue.put_nowait(END)


# Freed heap kept beyond this when the engine goes idle is given back to the OS. While steps run, glibc keeps what
# they free (platform.keep_freed_memory: a prefill's activations are reused, not faulted in again); kept after the
# last request, it is RSS nobody uses (a worker's grew with each new peak of its step shapes).
IDLE_GIVE_BACK_BYTES = 64 << 20


def give_back_when_idle() -> None:
    """On the engine thread, once the last request has finished: return the kept heap if it is worth it."""
    if heap.free_bytes() > IDLE_GIVE_BACK_BYTES:
        heap.give_back()


class AsyncEngine:
    def __init__(self, engine: LLMEngine, metrics: ServerMetrics | None = None,
                 max_waiting_requests: int | None = None, refill_wait_s: float = 0.0) -> None:
        self.engine = engine
        self.metrics = metrics
        self.max_waiting_requests = max_waiting_requests
        self.refill_wait_s = refill_wait_s
        self._cond = threading.Condition()
        self._cmds: list[AddCommand | AbortCommand | StopCommand | CallCommand] = []
        self._stop = False
        self._tracks: dict[str, _Track] = {}  # engine thread only
        self._thread: threading.Thread | None = None
        self._stats: EngineStats = engine.stats()
        self._info = EngineInfo.of(engine)
        self.dead: BaseException | None = None
        self.draining = False
        self._streams: weakref.WeakSet[RequestStream] = weakref.WeakSet()  # event loop only
        if metrics is not None:
            from hearth.platform import cpu_info

            metrics.set_cpu(cpu_info().isa, engine.threads, engine.bound_cores,
                            engine.block_manager.num_usable_blocks)
            metrics.set_cache_config(engine.cache_config_info())
            metrics.watch_grammar_cache(engine.structured.compiler)
            metrics.observe_stats(self._stats)

    # ---- lifecycle ----
    def start(self) -> None:
        if self._thread is None:
            if self.engine.bound_cores:
                # If the model was loaded on this thread (the event loop's; `hearth serve` loads on a thread that
                # exits instead, see cli_serve._load_engine), it stops running the model: unpin it so it does not
                # share core 0 with the engine thread's OpenMP master.
                release_calling_thread()
            self._thread = threading.Thread(target=self._run, name="hearth-engine", daemon=True)
            self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Let in-flight requests finish (up to timeout), then stop the engine thread."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning("engine thread still busy after %.0f s; abandoning it", timeout)

    def drain(self, timeout: float) -> None:
        """Call on the event loop when the server starts shutting down: new requests are refused at once, and the
        streams still open after `timeout` seconds end with a ShutdownError (their clients get an error event)."""
        self.draining = True
        asyncio.get_running_loop().call_later(max(0.0, timeout), self.end_open_streams)

    def end_open_streams(self) -> None:
        for stream in list(self._streams):
            stream.fail(ShutdownError("the server is shutting down: this request was stopped before it finished"))

    @property
    def stats(self) -> EngineStats:
        """The snapshot taken after the engine thread's last step or command (never touches the engine)."""
        return self._stats

    # ---- the event-loop side ----
    @property
    def info(self) -> EngineInfo:
        return self._info

    async def generate(self, requests: Sequence[EngineRequest]) -> RequestStream:
        """Queue engine requests that share one output stream.

        All or nothing: raises ValueError (a user error: too long, bad ids) or QueueFullError, and then none of
        them runs. Returns once the engine thread has accepted them.
        """
        if self.dead is not None:
            raise EngineDeadError("the engine loop has stopped after an internal error; restart the server")
        if self._stop or self.draining:
            raise QueueFullError("the server is shutting down")
        requests = engine_requests(requests)
        loop = asyncio.get_running_loop()
        state = StreamState(loop, asyncio.Queue(), sum(r.params.n for r in requests))
        ids = [r.request_id for r in requests]
        accepted = self.submit(requests, state)
        try:
            await accepted
        except asyncio.CancelledError:
            self.abort(ids)
            raise
        stream = RequestStream(self, ids, state, OutputProcessor.for_requests(self._info.tokenizer, requests))
        self._streams.add(stream)
        return stream

    def submit(self, requests: list[EngineRequest], state: StreamState) -> asyncio.Future:
        """Call on state.loop. Queue requests whose outputs go to `state`; the future resolves (None) once the
        engine thread has admitted them, or fails with their error. generate() and the engine worker use it.
        Their constraints are compiled first, off the engine thread (a cache hit after check_structured)."""
        if not any(getattr(r.params, "structured_outputs", None) for r in requests):
            return self._queue_add(requests, [None] * len(requests), state)  # (no hop: see ProcessEngine's Outputs)
        return state.loop.create_task(self._compile_and_queue(requests, state))

    async def _compile_and_queue(self, requests: list[EngineRequest], state: StreamState) -> None:
        grammars = [await asyncio.to_thread(self.engine.structured.compile, r.params.structured_outputs)
                    if getattr(r.params, "structured_outputs", None) else None for r in requests]
        await self._queue_add(requests, grammars, state)

    def _queue_add(self, requests: list[EngineRequest], grammars: list[CompiledGrammar | None],
                   state: StreamState) -> asyncio.Future:
        accepted = state.loop.create_future()
        self._queue(AddCommand(requests, grammars, state, accepted, time.monotonic()))
        return accepted

    def abort(self, request_ids: list[str]) -> None:
        """Abort requests (thread-safe): the engine frees their blocks before its next step."""
        self._queue(AbortCommand(list(request_ids)))

    def stop(self, stops: list[StopRequest]) -> None:
        """Finish sequences at the stop strings the front found (thread-safe); frees their blocks."""
        self._queue(StopCommand(list(stops)))

    async def check_structured(self, spec: StructuredOutputsParams) -> None:
        """Compile off the event loop and off the engine thread (cached by spec): submit's compile is then a cache
        hit. NOTE: a caller's timeout leaves the compile going in its thread (it cannot be stopped)."""
        await asyncio.to_thread(self.engine.structured.compile, spec)

    async def add_lora(self, lora: LoRARequest) -> None:
        """Read and check the adapter in a thread (the engine keeps stepping), then add it on the engine thread."""
        weights = await asyncio.to_thread(self.engine.read_lora, lora)
        await self._on_engine_thread(lambda: self.engine.add_lora(lora, weights))

    async def remove_lora(self, lora_id: int) -> None:
        await self._on_engine_thread(lambda: self.engine.remove_lora(lora_id))

    async def _on_engine_thread(self, call: Callable[[], object]) -> object:
        if self.dead is not None:
            raise EngineDeadError("the engine loop has stopped after an internal error; restart the server")
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._queue(CallCommand(call, loop, done))
        return await done

    def _queue(self, cmd: AddCommand | AbortCommand | StopCommand | CallCommand) -> None:
        with self._cond:
            self._cmds.append(cmd)
            self._cond.notify()

    # ---- the engine thread ----
    def _run(self) -> None:
        engine = self.engine
        if engine.bound_cores:  # this thread gets its own OpenMP pool: pin it like the loading thread's
            bind_omp_threads(engine.bound_cores)
        while True:
            finished = False
            with self._cond:
                while not self._cmds and not self._stop and not engine.has_unfinished_requests():
                    self._cond.wait()
                cmds, self._cmds = self._cmds, []
                stop = self._stop
            for cmd in cmds:
                self._apply(cmd)
            if stop and not engine.has_unfinished_requests():
                break
            stepped = engine.has_unfinished_requests() and self.dead is None
            if stepped:
                try:
                    outputs = engine.step()
                    self._dispatch(outputs)
                except Exception as e:  # a hearth bug: fail the requests in flight, keep serving new ones
                    logger.exception("engine step failed; aborting the %d requests in flight", len(self._tracks))
                    self._fail_all(e)
                else:
                    finished = any(o.finished for o in outputs)
                    if self.metrics is not None and engine.last_step_tokens:
                        self.metrics.observe_iteration(engine.last_step_tokens)
            self._publish_stats()
            if finished:
                self._wait_for_refill()
            if stepped and not engine.has_unfinished_requests():
                give_back_when_idle()

    def _wait_for_refill(self) -> None:
        """After a step that finished requests, with a free slot and nobody waiting: give clients up to
        refill_wait_s to send their next request, so it joins the next step instead of arriving during it and
        waiting that whole step (a client with a concurrency cap sends its next request as its last one ends, and a
        step with a prompt in it is long on a small CPU). Returns at once when a command arrives."""
        stats = self._stats
        if (self.refill_wait_s <= 0 or stats.num_waiting > 0
                or stats.num_running >= self.engine.scheduler.config.max_num_seqs):
            return
        with self._cond:
            self._cond.wait_for(lambda: self._cmds or self._stop, timeout=self.refill_wait_s)

    def _apply(self, cmd: AddCommand | AbortCommand | StopCommand | CallCommand) -> None:
        if isinstance(cmd, CallCommand):
            try:
                result, error = cmd.call(), None
            except Exception as e:  # (a user error such as LoRAError, or a bug: the caller gets it either way)
                result, error = None, e
            cmd.loop.call_soon_threadsafe(_resolve, cmd.done, error, result)
            return
        if isinstance(cmd, StopCommand):
            outputs = [self.engine.stop_sequence(s.request_id, s.index, s.stop) for s in cmd.stops]
            self._dispatch([o for o in outputs if o is not None])
            return
        if isinstance(cmd, AbortCommand):
            for rid in cmd.request_ids:
                self.engine.abort_request(rid)
                track = self._tracks.pop(rid, None)
                if track is not None and self.metrics is not None:
                    self.metrics.request_success["abort"].inc()
            return
        error = self._admit(cmd)
        if error is None:
            cmd.state.loop.call_soon_threadsafe(_resolve, cmd.accepted, None)
        else:
            cmd.state.loop.call_soon_threadsafe(_resolve, cmd.accepted, error)

    def _admit(self, cmd: AddCommand) -> BaseException | None:
        if self.dead is not None:
            return EngineDeadError("the engine loop has stopped after an internal error")
        sched = self.engine.scheduler
        if self.max_waiting_requests is not None:
            # Requests that will wait: the queue plus these, minus the sequence slots free right now.
            free_slots = max(0, sched.config.max_num_seqs - len(sched.running))
            need = sum(r.params.n for r in cmd.requests)
            backlog = len(sched.waiting) + need - free_slots
            if backlog > self.max_waiting_requests:
                return QueueFullError(f"the server is busy: its waiting queue is full (limit "
                                      f"{self.max_waiting_requests}, --max-waiting-requests; {len(sched.waiting)} "
                                      f"waiting, {free_slots} free slots, this request needs {need}); retry after "
                                      f"{QueueFullError.retry_after} s")
        added: list[str] = []
        for r, grammar in zip(cmd.requests, cmd.grammars):
            rid, params = r.request_id, r.params
            try:
                self.engine.add_request(rid, r.prompt_token_ids, params, arrival_time=cmd.arrival, grammar=grammar,
                                        lora_request=r.lora_request, mm_inputs=r.mm_inputs)
            except ValueError as e:
                for done in added:
                    self.engine.abort_request(done)
                    self._tracks.pop(done, None)
                return e
            added.append(rid)
            reqs = [self.engine.seqs[child].request for child in self.engine.parents.get(rid, [])]
            self._tracks[rid] = _Track(cmd.state, cmd.arrival, reqs, params.n)
        return None

    def _dispatch(self, outputs: list[StepOutput]) -> None:
        now = time.monotonic()
        batches: dict[int, tuple[StreamState, list[StepOutput]]] = {}
        for out in outputs:
            track = self._tracks.get(out.request_id)
            if track is None:
                continue  # aborted meanwhile
            self._observe(track, out, now)
            batches.setdefault(id(track.state), (track.state, []))[1].append(out)
            if out.finished:
                track.state.remaining -= 1
                track.n_left -= 1
                if track.n_left == 0:
                    del self._tracks[out.request_id]
        for state, outs in batches.values():
            state.post(outs)
            if state.remaining == 0:
                state.post(END)

    def _observe(self, track: _Track, out: StepOutput, now: float) -> None:
        m = self.metrics
        if m is None:
            return
        if track.first_token is None:
            track.first_token = now
            m.ttft.observe(now - track.arrival)
            m.prompt_tokens.inc(out.num_prompt_tokens)
        last = track.last_token.get(out.index)
        if last is not None:
            m.itl.observe(now - last)
            m.tpot.observe(now - last)
        track.last_token[out.index] = now
        m.generation_tokens.inc(len(out.new_token_ids))
        track.generated += len(out.new_token_ids)
        if out.finished and track.n_left == 1:
            m.e2e.observe(now - track.arrival)
            scheduled = [r.first_scheduled_time for r in track.requests if r.first_scheduled_time is not None]
            if scheduled:
                m.queue_time.observe(max(0.0, min(scheduled) - track.arrival))
            first = track.requests[0] if track.requests else None
            m.observe_request(prompt_tokens=out.num_prompt_tokens, generation_tokens=track.generated,
                              n=len(track.requests) or 1,
                              max_tokens=getattr(first.params, "max_tokens", None) if first else None,
                              arrival=track.arrival, scheduled=min(scheduled) if scheduled else None,
                              first_token=track.first_token, finished=now)
            reason = out.finish_reason if out.finish_reason in m.request_success else "stop"
            m.request_success[reason].inc()

    def _fail_all(self, error: Exception) -> None:
        """Fail every stream in flight. Only if their blocks cannot be freed is the engine declared dead."""
        for rid, track in list(self._tracks.items()):
            try:
                self.engine.abort_request(rid)
            except Exception:
                logger.exception("abort after a failed step failed too: the engine is dead")
                self.dead = error
            track.state.post(EngineDeadError(f"internal engine error: {type(error).__name__}: {error}"))
        self._tracks.clear()

    def _publish_stats(self) -> None:
        self._stats = self.engine.stats()
        if self.metrics is not None:
            self.metrics.observe_stats(self._stats)


def _resolve(fut: asyncio.Future, error: BaseException | None, result: object = None) -> None:
    if fut.done():  # the caller went away (cancelled) before the engine answered
        return
    if error is None:
        fut.set_result(result)
    else:
        fut.set_exception(error)
