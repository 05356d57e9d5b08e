"""ModelRouter: several models behind one endpoint, each in its own worker process(es), loaded on first use.

A request names a model (or an alias); an unknown name is a 404 listing the names. An unloaded model is loaded
while the request waits (bounded by --model-load-timeout; other models keep serving). Under the budget
(--max-loaded-models, --models-memory: weights + KV), the least recently used unpinned idle model is unloaded
first; --idle-unload-seconds unloads idle ones. Unloading ends the worker process, so its memory goes back to the
OS, and the front drops the model's state and gives back the heap it freed (give_back_heap).
NOTE: everything here runs on the event loop; _lock orders "make room, then spawn" between requests.
"""
from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import os
import time
from contextvars import ContextVar
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Receive, Scope, Send

from hearth.config import EngineArgs
from hearth.engine.core_slots import CoreSlots
from hearth.distributed.dp_cores import dp_core_sets
from hearth.engine.dp_engine import DataParallelEngine
from hearth.engine.engine_worker import WorkerOptions
from hearth.engine.llm_engine import EngineStats
from hearth.heap import give_back
from hearth.entrypoints.openai.errors import APIError
from hearth.entrypoints.openai.lora_adapters import LoRAAdapters
from hearth.entrypoints.openai.lora_modules import LoRAModule
from hearth.entrypoints.openai.model_specs import ModelSpec
from hearth.entrypoints.openai.served_models import Listing
from hearth.entrypoints.openai.serving_build import ServeOptions, serving_context
from hearth.entrypoints.openai.serving_common import ServingContext
from hearth.entrypoints.web.routes import TokenRate
from hearth.metrics_merge import merge_expositions

logger = logging.getLogger("hearth")

GiB = 1024 ** 3
DEFAULT_KV_SPACE_GIB = 1.0  # per model when several share the machine and --kv-cache-space is not set
_POLL_S = 0.1
_EXIT_WAIT_S = 5.0  # after an unload's drain, for its workers' exits to be handled


@dataclass
class RouterConfig:
    max_loaded_models: int | None = None
    models_memory_gib: float | None = None
    idle_unload_seconds: float | None = None
    load_timeout: float = 300.0
    data_parallel_size: int = 1
    # per core slot (hearth.engine.core_slots), one --omp-threads-bind value per data-parallel engine
    core_slots: list[list[str | None]] = field(default_factory=lambda: [[None]])
    drain_timeout: float = 30.0
    serve: ServeOptions = field(default_factory=ServeOptions)  # every model's, unless its own entry says otherwise


@dataclass
class _Entry:
    spec: ModelSpec
    args: EngineArgs
    engine: DataParallelEngine | None = None
    ctx: ServingContext | None = None
    load_task: asyncio.Task | None = None
    last_used: float = field(default_factory=time.monotonic)
    error: str | None = None
    unloads: int = 0
    holds: int = 0  # HTTP requests in progress that asked for this model (HoldModels): busy before they submit


    @property
    def state(self) -> str:
        if self.engine is None:
            return "unloaded"
        if self.ctx is None or self.engine.loading:
            return "loading"
        return "loaded" if self.engine.dead is None else "unloaded"

    @property
    def busy(self) -> bool:
        return self.engine is not None and (self.holds > 0 or self.engine.in_flight > 0)

    def size_bytes(self) -> int:
        """Weights + KV cache: what the worker reported, else an estimate from the file and --kv-cache-space."""
        info = self.engine.info if self.engine is not None else None
        n = self.engine.size if self.engine is not None else 1
        if info is not None:
            return (info.weights_bytes + info.kv_bytes) * n
        kv = self.args.kv_cache_space or DEFAULT_KV_SPACE_GIB
        return (_path_bytes(self.spec.path) + int(kv * GiB)) * n


# The models the HTTP request in progress asked the router for (set by HoldModels; a list, so that context() calls
# in the request's own tasks add to the same one).
_HELD: ContextVar[list[_Entry] | None] = ContextVar("hearth_held_models", default=None)


class HoldModels:
    """ASGI middleware: a model a request has asked for counts as busy until the request's response ends, so a load
    cannot unload it between the request getting its serving context and submitting to its engine."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        held: list[_Entry] = []
        token = _HELD.set(held)
        try:
            await self.app(scope, receive, send)
        finally:
            _HELD.reset(token)
            for entry in held:
                entry.holds -= 1


async def give_back_heap() -> None:
    """Free what the front dropped (a cycle too) and return the freed heap pages to the OS. Without it the front
    grew with every model swap though nothing was kept: glibc holds the pages freed by a model's tokenizer, and
    the transients of unpickling the next one, in the reader threads' arenas."""
    gc.collect()
    await asyncio.to_thread(give_back)


def _path_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files if f.endswith((".safetensors", ".gguf")))
    return total


class _FrontMetrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry()


class ModelRouter:
    def __init__(self, specs: list[ModelSpec], base: EngineArgs, config: RouterConfig,
                 lora_modules: list[LoRAModule] | None = None) -> None:
        """lora_modules: --lora-modules of the one data-parallel model (the serve plan allows --enable-lora only
        with one model)."""
        self.config = config
        self.entries: list[_Entry] = []
        for spec in specs:
            args = dataclasses.replace(base, model=spec.path, served_model_name=spec.name, **spec.engine_args)
            if args.kv_cache_space is None and len(specs) > 1:
                from hearth import envs

                if envs.kv_cache_space_gib() is None:
                    args = dataclasses.replace(args, kv_cache_space=DEFAULT_KV_SPACE_GIB)
            self.entries.append(_Entry(spec, args))
        self._names = {n: e for e in self.entries for n in [e.spec.name, *e.spec.aliases]}
        self.cores = CoreSlots(config.core_slots)
        self._rates: dict[str, TokenRate] = {}  # per model: the web page's output tokens/s
        self._lock = asyncio.Lock()
        self._janitor: asyncio.Task | None = None
        self._warmed = False
        self.dead = None  # AsyncEngine's attribute /health reads: the front itself never dies of a model
        self.metrics = None
        self.front = _FrontMetrics()  # the front's own series (API keys), merged into /metrics
        self.created = int(time.time())
        # The one model's LoRA adapters, served by name over its workers (attached at each load)
        self.adapters = LoRAAdapters(None) if base.enable_lora else None
        self.lora_modules = lora_modules or []

    # ---- lifecycle ----
    async def start(self) -> None:
        """Load the pinned models (before the server answers), start the idle-unload loop."""
        pinned = [e for e in self.entries if e.spec.pinned]
        await asyncio.gather(*(self._ensure_loaded(e) for e in pinned))
        self._janitor = asyncio.create_task(self._janitor_loop())

    async def shutdown(self) -> None:
        if self._janitor is not None:
            self._janitor.cancel()
        engines = [e.engine for e in self.entries if e.engine is not None]
        await asyncio.gather(*(asyncio.to_thread(eng.shutdown, self.config.drain_timeout) for eng in engines))

    # ---- routing ----
    def names(self) -> list[str]:
        return [e.spec.name for e in self.entries]

    def resolve(self, name: str | None) -> _Entry:
        if name is None:  # NOTE: as vLLM: an absent model is the (first) served one
            return self.entries[0]
        entry = self._names.get(name)
        if entry is None:
            raise APIError(404, f"the model {name!r} does not exist; this server serves: "
                           f"{', '.join(self.names())}", param="model", code="model_not_found")
        return entry

    async def context(self, name: str | None) -> ServingContext:
        """The serving context of the named model (or LoRA adapter), loading it first if it must (the request
        waits, bounded)."""
        if self.adapters is not None and name is not None and name not in self._names:
            await self.context(self.entries[0].spec.name)  # (a reload attaches the adapters again)
            adapter = self.adapters.context(name)
            if adapter is not None:
                return adapter
        entry = self.resolve(name)
        entry.last_used = time.monotonic()
        held = _HELD.get()
        if held is not None and entry not in held:  # from now on (while loading too) no load evicts it under us
            entry.holds += 1
            held.append(entry)
        if entry.state != "loaded":
            await self._ensure_loaded(entry)
        ctx = entry.ctx
        if ctx is None:  # it failed to load, or was unloaded, between our wait and now
            raise APIError(503, f"the model {entry.spec.name!r} is not loaded ({entry.error or 'unloaded'}); "
                           "retry", "server_error", code="model_not_loaded", headers={"Retry-After": "1"})
        entry.last_used = time.monotonic()
        return ctx

    async def _ensure_loaded(self, entry: _Entry) -> None:
        deadline = time.monotonic() + self.config.load_timeout
        async with self._lock:
            if entry.engine is not None and entry.engine.dead is not None and not entry.engine.loading:
                entry.engine, entry.ctx = None, None  # every engine stayed down after its restarts: start afresh
                self.cores.release(entry.spec.name)
            if entry.engine is None:
                await self._make_room(entry, deadline)
                entry.error = None
                entry.engine = DataParallelEngine(entry.args, self.worker_options(entry), self._binds(entry),
                                                  self.config.load_timeout)
                entry.load_task = asyncio.create_task(self._load(entry))
        task = entry.load_task
        if task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise APIError(503, f"the model {entry.spec.name!r} is still loading; retry shortly",
                           "server_overloaded", code="model_loading", headers={"Retry-After": "5"}) from None
        except APIError:
            raise
        except Exception as e:
            raise APIError(503, f"the model {entry.spec.name!r} failed to load: {e}", "server_error",
                           code="model_load_failed") from None

    def worker_options(self, entry: _Entry) -> WorkerOptions:
        """What each of the model's worker processes gets beside its EngineArgs (its client is assembled there)."""
        return WorkerOptions(entry.spec.name, "0", self.serve_options(entry).client)

    def serve_options(self, entry: _Entry) -> ServeOptions:
        """The model's serving options: the flags, with its --models-config entry's own winning."""
        return self.config.serve.for_model(entry.spec.serving)

    def _binds(self, entry: _Entry) -> list[str | None]:
        """Its own omp-threads-bind (TOML), else a core slot's."""
        own = entry.spec.engine_args.get("omp_threads_bind")
        if own is not None:
            return list(dp_core_sets(self.config.data_parallel_size, own, entry.args.threads))
        return self.cores.take(entry.spec.name)

    async def _load(self, entry: _Entry) -> None:
        t0 = time.perf_counter()
        engine = entry.engine
        try:
            info = await engine.load()
        except BaseException as e:
            entry.engine, entry.error = None, str(e)
            self.cores.release(entry.spec.name)
            logger.error("loading model %r failed: %s", entry.spec.name, e)
            raise
        finally:
            entry.load_task = None
        try:
            ctx = serving_context(engine, self.serve_options(entry), entry.spec.name, entry.spec.aliases)
            if self.adapters is not None:
                await self.adapters.attach(ctx, self.lora_modules)
        except ValueError as e:  # (a LoRAError of --lora-modules too)
            entry.engine, entry.error = None, f"model {entry.spec.name!r}: {e}"
            self.cores.release(entry.spec.name)
            logger.error("%s", entry.error)
            await asyncio.to_thread(engine.shutdown, 0.0)
            raise
        entry.ctx = ctx
        entry.last_used = time.monotonic()
        await give_back_heap()  # what unpickling the model's tokenizer took beside it
        logger.info("model %r loaded in %.1f s (%d engine%s, pid %s)", entry.spec.name, time.perf_counter() - t0,
                    engine.size, "s" if engine.size > 1 else "", ",".join(map(str, engine.pids)))
        if not self._warmed:  # the chat template renderer's first use imports transformers: not in a request
            self._warmed = True
            asyncio.create_task(asyncio.to_thread(info.tokenizer.warm_up))

    # ---- the budget ----
    def _resident(self, exclude: _Entry) -> list[_Entry]:
        return [e for e in self.entries if e.engine is not None and e is not exclude]

    def _over_budget(self, entry: _Entry) -> str | None:
        resident = self._resident(entry)
        cfg = self.config
        if cfg.max_loaded_models is not None and len(resident) + 1 > cfg.max_loaded_models:
            return f"--max-loaded-models {cfg.max_loaded_models}"
        if cfg.models_memory_gib is not None:
            used = sum(e.size_bytes() for e in resident) + entry.size_bytes()
            if used > cfg.models_memory_gib * GiB:
                return f"--models-memory {cfg.models_memory_gib:g} GiB"
        return None

    async def _make_room(self, entry: _Entry, deadline: float) -> None:
        """Unload least recently used idle unpinned models until `entry` fits; wait (bounded) while all are busy."""
        while (limit := self._over_budget(entry)) is not None:
            victims = sorted((e for e in self._resident(entry) if not e.spec.pinned and not e.busy
                              and e.state == "loaded"), key=lambda e: e.last_used)
            if victims:
                await self.unload(victims[0], reason=f"to make room for {entry.spec.name!r} ({limit})")
                continue
            if not self._resident(entry) or all(e.spec.pinned for e in self._resident(entry)):
                need = entry.size_bytes() / GiB
                raise APIError(503, f"the model {entry.spec.name!r} (~{need:.2f} GiB) does not fit beside the "
                               f"pinned models under {limit}: raise it or unpin a model", "server_error",
                               code="model_over_budget")
            if time.monotonic() > deadline:
                raise APIError(503, f"cannot load {entry.spec.name!r}: every loaded model is busy ({limit}); "
                               "retry shortly", "server_overloaded", code="models_busy",
                               headers={"Retry-After": "5"})
            await asyncio.sleep(_POLL_S)

    async def unload(self, entry: _Entry, reason: str = "on request") -> None:
        """End the model's worker processes (in-flight requests get up to the drain timeout to finish)."""
        engine = entry.engine
        if engine is None:
            return
        if entry.load_task is not None:
            entry.load_task.cancel()
        ctx = entry.ctx
        entry.engine, entry.ctx = None, None
        self.cores.release(entry.spec.name)
        entry.unloads += 1
        logger.info("unloading model %r %s", entry.spec.name, reason)
        await asyncio.to_thread(engine.shutdown, self.config.drain_timeout)
        await engine.exited(_EXIT_WAIT_S)
        if ctx is not None:
            await asyncio.to_thread(ctx.sandbox.shutdown)  # its request-template worker, if one was started
        del engine, ctx
        await give_back_heap()

    async def _janitor_loop(self) -> None:
        idle_s = self.config.idle_unload_seconds
        period = min(1.0, idle_s / 4) if idle_s else 1.0
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for e in self.entries:
                if e.busy:
                    e.last_used = now  # LRU order follows activity, not just arrivals
                elif (idle_s is not None and not e.spec.pinned and e.state == "loaded"
                      and now - e.last_used >= idle_s):
                    await self.unload(e, reason=f"after {idle_s:g} s idle (--idle-unload-seconds)")

    # ---- what the routes show ----
    @property
    def stats(self) -> EngineStats:
        total = EngineStats(0, 0, 0.0, 0, 0, 0, 0)
        for e in self.entries:
            if e.engine is not None:
                s = e.engine.stats
                total.num_running += s.num_running
                total.num_waiting += s.num_waiting
                total.num_used_blocks += s.num_used_blocks
        return total

    def describe(self, entry: _Entry) -> dict:
        engine = entry.engine
        info = engine.info if engine is not None else None
        stats = engine.stats if engine is not None else None
        return {
            "name": entry.spec.name, "aliases": entry.spec.aliases, "path": entry.spec.path,
            "state": entry.state, "pinned": entry.spec.pinned, "size_bytes": entry.size_bytes(),
            "max_model_len": info.max_model_len if info is not None else entry.args.max_model_len,
            "idle_seconds": None if entry.busy else round(time.monotonic() - entry.last_used, 1),
            "pids": engine.pids if engine is not None else [],
            "restarts": sum(engine.restarts) if engine is not None else 0,
            "bound_cores": [r.info.bound_cores for r in engine.ranks if r.info is not None] if engine else [],
            "num_requests_running": stats.num_running if stats else 0,
            "num_requests_waiting": stats.num_waiting if stats else 0,
            "kv_used_blocks": stats.num_used_blocks if stats else 0,
            "error": entry.error,
        }

    def listings(self) -> list[Listing]:
        return [Listing(e.spec.name, e.spec.path, e.ctx if e.state == "loaded" else None) for e in self.entries]

    def openai_list(self) -> dict:
        data = []
        for e in self.entries:
            d = self.describe(e)
            data.append({"id": e.spec.name, "object": "model", "created": self.created, "owned_by": "hearth",
                         "root": e.spec.path, "parent": None, "max_model_len": d["max_model_len"],
                         "state": d["state"], "aliases": e.spec.aliases})
        return {"object": "list", "data": data + (self.adapters.cards() if self.adapters is not None else [])}

    async def render_metrics(self) -> bytes:
        engines = [e.engine for e in self.entries if e.engine is not None and e.state == "loaded"]
        from prometheus_client import generate_latest

        texts = await asyncio.gather(*(eng.render_metrics() for eng in engines))
        return merge_expositions([generate_latest(self.front.registry), *texts])

    def status(self) -> dict:
        """The web page's GET /status, for every model (hearth.entrypoints.web.routes gives it for one)."""
        models = []
        for e in self.entries:
            s = e.engine.stats if e.engine is not None else EngineStats(0, 0, 0.0, 0, 0, 0, 0)
            info = e.engine.info if e.engine is not None else None
            generated = e.engine.generated if e.engine is not None else None
            if generated is None:
                self._rates.pop(e.spec.name, None)  # a reload counts from 0 again
            rate = self._rates.setdefault(e.spec.name, TokenRate()) if generated is not None else None
            models.append({"name": e.spec.name, "state": e.state, "num_requests_running": s.num_running,
                           "num_requests_waiting": s.num_waiting, "kv_cache_usage_perc": s.kv_usage,
                           "kv_cache_used_blocks": s.num_used_blocks,
                           "kv_cache_total_blocks": info.num_blocks * e.engine.size if info is not None else None,
                           "generation_tokens_total": generated,
                           "generation_tokens_per_s": rate.update(generated) if rate is not None else None})
        return {"object": "status", "models": models,
                "num_requests_running": sum(m["num_requests_running"] for m in models),
                "num_requests_waiting": sum(m["num_requests_waiting"] for m in models)}
