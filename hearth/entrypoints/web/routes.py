"""GET / (the chat page, from files in the package: nothing is fetched at run time) and GET /status (what the
page's status view shows: requests running and waiting, KV usage, output tokens/s, the loaded models)."""
from __future__ import annotations

import time
from collections import deque
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from hearth.engine.protocol import EngineClient
from hearth.entrypoints.openai.model_access import visible_status
from hearth.entrypoints.openai.serving_common import ServingContext

STATIC = Path(__file__).parent / "static"
_RATE_WINDOW_S = 10.0  # tokens/s is averaged over the polls of the last this-many seconds


class TokenRate:
    """Output tokens/s from a cumulative count, sampled whenever someone asks (the page polls every few
    seconds): no background task, and nothing to do while nobody looks."""

    def __init__(self) -> None:
        self.samples: deque[tuple[float, float]] = deque()

    def update(self, total: float, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        self.samples.append((now, total))
        while len(self.samples) > 2 and self.samples[1][0] <= now - _RATE_WINDOW_S:
            self.samples.popleft()
        (t0, n0), (t1, n1) = self.samples[0], self.samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0


def model_status(name: str, engine: EngineClient, rate: TokenRate) -> dict:
    s = engine.stats
    generated = None
    if engine.metrics is not None:
        generated = engine.metrics.registry.get_sample_value("vllm:generation_tokens_total",
                                                             {"model_name": name, "engine": "0"})
    return {"name": name, "state": "loaded" if engine.dead is None else "error",
            "num_requests_running": s.num_running, "num_requests_waiting": s.num_waiting,
            "kv_cache_usage_perc": s.kv_usage, "kv_cache_used_blocks": s.num_used_blocks,
            "kv_cache_total_blocks": engine.info.num_blocks,
            "generation_tokens_total": generated,
            "generation_tokens_per_s": rate.update(generated) if generated is not None else None}


def register_page(app: FastAPI) -> None:
    """The chat page and its static files (a model router adds its own /status)."""

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=STATIC), name="static")


def register(app: FastAPI, engine: EngineClient, ctx: ServingContext) -> None:
    """The page and GET /status for one model."""
    rate = TokenRate()
    register_page(app)

    @app.get("/status")
    async def status() -> dict:
        return visible_status({"object": "status", "models": [model_status(ctx.model_name, engine, rate)],
                               "num_requests_running": 0, "num_requests_waiting": 0})
