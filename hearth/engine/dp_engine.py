"""DataParallelEngine: N ProcessEngines of one model behind one EngineClient (engine/protocol.py) (vLLM's --data-parallel-size).

Each request goes to the live engine with the least running + waiting work (the sequences this front has in
flight on it: exact and current, where the workers' stats lag by a push period). A rank that dies fails only its
own in-flight requests (503) and is restarted in the background; the others keep serving. With size 1 this is
also how the model router runs each model: one worker process, restarted on a crash.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Collection, Sequence

from hearth.config import EngineArgs
from hearth.engine.async_engine import RequestStream
from hearth.engine.engine_worker import WorkerOptions
from hearth.engine.llm_engine import EngineStats
from hearth.engine.output_processor import StopRequest
from hearth.engine.process_engine import LoadFailedError, NotStartedError, ProcessEngine, WorkerDiedError
from hearth.engine.protocol import EngineInfo, EngineRequest, engine_requests
from hearth.lora.request import LoRARequest
from hearth.metrics_merge import merge_expositions
from hearth.structured.params import StructuredOutputsParams

logger = logging.getLogger("hearth")

MAX_RESTARTS = 3  # consecutive failed restarts of one rank before it stays down


class DataParallelEngine:
    def __init__(self, args: EngineArgs, opts: WorkerOptions, binds: list[str | None], load_timeout: float,
                 restart: bool = True) -> None:
        self.args, self.opts, self.binds = args, opts, binds
        self.load_timeout = load_timeout
        self.restart = restart
        self.metrics = None  # no registry in this process: render_metrics() asks the workers
        self.ranks: list[ProcessEngine] = [self._new_rank(i) for i in range(len(binds))]
        self.restarts = [0] * len(binds)  # per rank, since the start (what `hearth ps` / GET /models show)
        self._failures = [0] * len(binds)  # consecutive failed restarts
        self._watchers: list[asyncio.Task] = []
        self._restarting: dict[int, asyncio.Task] = {}
        self._closing = False
        self._rank_ready = asyncio.Event()  # set while at least one rank is loaded and alive
        self._last_info: EngineInfo | None = None

    @property
    def size(self) -> int:
        return len(self.ranks)

    def _new_rank(self, i: int) -> ProcessEngine:
        args = self.args
        if self.binds[i] is not None:
            args = dataclasses.replace(args, omp_threads_bind=self.binds[i],
                                       threads=args.threads if self.binds[i] == "nobind" else None)
        return ProcessEngine(args, dataclasses.replace(self.opts, engine_label=str(i)))

    # ---- lifecycle ----
    def start(self) -> None:
        """Nothing: load() starts the workers."""

    async def load(self, timeout: float | None = None) -> EngineInfo:
        """Start every rank and wait for all of them (up to timeout s, default the load_timeout it was made with).
        On failure none is left running."""
        timeout = self.load_timeout if timeout is None else timeout
        try:
            infos = await asyncio.gather(*(r.load(timeout) for r in self.ranks))
        except BaseException:
            await asyncio.to_thread(self._kill_all)
            raise
        self._rank_ready.set()
        self._last_info = infos[0]
        self._watchers = [asyncio.create_task(self._watch(i)) for i in range(self.size)]
        return infos[0]

    @property
    def info(self) -> EngineInfo | None:
        """A live rank's, else the last loaded one's: the model stays the same while a rank restarts, and the
        serving context keeps reading it (generation defaults, HF config) meanwhile."""
        info = next((r.info for r in self.ranks if r.info is not None), None)
        if info is not None:
            self._last_info = info
        return info or self._last_info

    @property
    def pids(self) -> list[int]:
        return [r.pid for r in self.ranks if r.pid is not None and r.dead is None]

    @property
    def loading(self) -> bool:
        return bool(self._restarting)

    @property
    def dead(self) -> BaseException | None:
        live = [r for r in self.ranks if r.dead is None]
        if live or self._restarting:
            return None
        return self.ranks[0].dead

    @property
    def in_flight(self) -> int:
        return sum(r.in_flight for r in self.ranks)

    @property
    def generated(self) -> int:
        """Output tokens of the live ranks since they started (a restarted rank counts from 0)."""
        return sum(r.generated for r in self.ranks)

    @property
    def stats(self) -> EngineStats:
        stats = [r.stats for r in self.ranks]
        total = EngineStats(0, 0, 0.0, 0, 0, 0, 0)
        for s in stats:
            total.num_running += s.num_running
            total.num_waiting += s.num_waiting
            total.num_used_blocks += s.num_used_blocks
            total.num_preemptions += s.num_preemptions
            total.prefix_queries += s.prefix_queries
            total.prefix_hits += s.prefix_hits
            total.mm_images_encoded += s.mm_images_encoded
            total.mm_encoder_seconds += s.mm_encoder_seconds
            total.mm_encoder_cache_hits += s.mm_encoder_cache_hits
        total.kv_usage = sum(s.kv_usage for s in stats) / max(1, len(stats))
        return total

    async def _watch(self, i: int) -> None:
        """Restart rank i whenever its process exits while the engine is open."""
        while True:
            rank = self.ranks[i]
            await rank.exited.wait()
            if self._closing or not self.restart:
                return
            if not any(r.dead is None for r in self.ranks):
                self._rank_ready.clear()
            logger.warning("restarting engine %d of model %r (its worker exited with %s)", i, self.opts.name,
                           rank.exitcode)
            task = asyncio.current_task()
            self._restarting[i] = task
            try:
                while True:
                    fresh = self._new_rank(i)
                    self.ranks[i] = fresh
                    self.restarts[i] += 1
                    try:
                        await fresh.load(self.load_timeout)
                        self._failures[i] = 0
                        break
                    except (LoadFailedError, TimeoutError) as e:
                        fresh.kill()
                        self._failures[i] += 1
                        if self._failures[i] >= MAX_RESTARTS or self._closing:
                            logger.error("engine %d of model %r stays down: %s", i, self.opts.name, e)
                            return
                        await asyncio.sleep(1.0)
            finally:
                self._restarting.pop(i, None)
            self._rank_ready.set()

    def kill(self) -> None:
        self._closing = True
        self._kill_all()

    def _kill_all(self) -> None:
        for r in self.ranks:
            r.kill()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Drain every rank (in parallel, up to timeout), then their processes exit."""
        self._closing = True
        for w in self._watchers:
            w.get_loop().call_soon_threadsafe(w.cancel)
        # NOTE: a cancelled watcher's traceback holds this engine: kept here, that would be a cycle only gc frees
        self._watchers = []
        threads = [threading.Thread(target=r.shutdown, args=(timeout,)) for r in self.ranks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    async def exited(self, timeout: float) -> None:
        """Wait (up to timeout s) until every rank's process exit has been handled: till then its reader thread
        holds the rank, and with it the model's tokenizer."""
        waits = [asyncio.ensure_future(r.exited.wait()) for r in self.ranks]
        await asyncio.wait(waits, timeout=timeout)
        for w in waits:
            w.cancel()

    # ---- requests ----
    def _pick(self, exclude: Collection[int] = ()) -> ProcessEngine | None:
        live = [r for r in self.ranks if r.dead is None and r.info is not None and id(r) not in exclude]
        return min(live, key=lambda r: r.in_flight, default=None)

    async def generate(self, requests: Sequence[EngineRequest]) -> RequestStream:
        requests = engine_requests(requests)
        rank = self._pick()
        if rank is None and self._restarting:
            # Every rank is down and coming back: wait for one (bounded), as for a model that must load.
            try:
                await asyncio.wait_for(self._rank_ready.wait(), self.load_timeout)
            except TimeoutError:
                pass
            rank = self._pick()
        if rank is None:
            raise WorkerDiedError(f"no engine of model {self.opts.name!r} is running "
                                  f"({self.ranks[0].dead or 'not loaded'})")
        tried: set[int] = set()
        while True:
            try:
                return await rank.generate(requests)
            except NotStartedError:
                # The rank died under this request before it started: the next live rank takes it (once each).
                tried.add(id(rank))
                rank = self._pick(exclude=tried)
                if rank is None:
                    raise

    def abort(self, request_ids: list[str]) -> None:
        # NOTE: streams abort through the rank that runs them; this serves callers that only know the ids.
        for r in self.ranks:
            r.abort(request_ids)

    def stop(self, stops: list[StopRequest]) -> None:
        # NOTE: as abort: a stream stops through its own rank; the others ignore ids they do not hold.
        for r in self.ranks:
            r.stop(stops)

    async def check_structured(self, spec: StructuredOutputsParams) -> None:
        """Compiled by the worker the next request would go to (its cache then has it); ValueError if bad."""
        rank = self._pick()
        if rank is not None:
            await rank.check_structured(spec)

    async def add_lora(self, lora: LoRARequest) -> None:
        """Every rank adds it (a request may go to any); the first rank's error is raised."""
        await asyncio.gather(*(r.add_lora(lora) for r in self.ranks))

    async def remove_lora(self, lora_id: int) -> None:
        await asyncio.gather(*(r.remove_lora(lora_id) for r in self.ranks))

    async def render_metrics(self) -> bytes:
        texts = await asyncio.gather(*(r.render_metrics() for r in self.ranks))
        return merge_expositions(list(texts))
