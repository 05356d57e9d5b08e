"""The FastAPI app: thin routes over the serving layer, an ASGI guard for API keys and body size, lifespan."""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from hearth import __version__
from hearth.engine.async_engine import AsyncEngine
from hearth.entrypoints.ollama import serving as ollama_serving
from hearth.entrypoints.openai import serving_anthropic, serving_keys, serving_responses, serving_tokenize
from hearth.entrypoints.openai.errors import APIError, install_handlers
from hearth.entrypoints.openai.gateway import Gateway
from hearth.entrypoints.openai.guard import Guard
from hearth.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from hearth.entrypoints.openai.serving_chat import create_chat_completion
from hearth.entrypoints.openai.serving_common import ServingContext
from hearth.entrypoints.openai.routes_pooling import register_pooling_routes
from hearth.entrypoints.openai.serving_completion import create_completion
from hearth.entrypoints.web import routes as web
from hearth.metrics import CONTENT_TYPE

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024

logger = logging.getLogger("hearth")


@dataclass
class ServerConfig:
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    drain_timeout: float = 30.0
    api_key_file: str | None = None  # per-user keys with limits (TOML); replaces api_key when set


M = TypeVar("M", bound=BaseModel)


async def parse_body(raw: Request, model: type[M]) -> M:
    """JSON whatever the content-type says (curl users forget it); bad JSON and bad fields are 400s."""
    data = await raw.body()
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}") from None
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        raise RequestValidationError(e.errors()) from None


async def warm_when_idle(engine: AsyncEngine, warm_up: Callable[[], object], idle_s: float = 5.0,
                         poll_s: float = 0.1) -> None:
    """Run warm_up (in a thread) once the engine has been idle for idle_s: the chat-template renderer's first use
    imports transformers (a second or more), which an interactive user's first chat request then does not pay. A
    client that sends at once is not slowed by it (the import holds the GIL and a core beside its requests): it
    waits for quiet. NOTE: a one-second quiet was too short: a client that looked up /v1/models after /health still
    met the import with its first requests, doubling their TTFT."""
    quiet = 0.0
    while quiet < idle_s:
        await asyncio.sleep(poll_s)
        s = engine.stats
        quiet = quiet + poll_s if s.num_running == 0 and s.num_waiting == 0 else 0.0
    try:
        await asyncio.to_thread(warm_up)
    except Exception as e:  # a template that cannot render a plain message fails its requests later, not here
        logger.debug("chat template warm-up failed: %s", e)


def build_app(engine: AsyncEngine, ctx: ServingContext, config: ServerConfig,
              gateway: Gateway | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI):
        engine.start()
        serving_keys.reload_on_sighup(keys)
        warm = asyncio.create_task(warm_when_idle(engine, ctx.tokenizer.warm_up))
        yield
        warm.cancel()
        if gateway is not None:
            await gateway.aclose()
        # uvicorn has already drained in-flight HTTP requests by now (graceful shutdown on SIGTERM).
        engine.shutdown(config.drain_timeout)

    app = FastAPI(title="hearth", version=__version__, lifespan=lifespan)
    install_handlers(app)
    keys = serving_keys.key_ring(config.api_key, config.api_key_file, engine.metrics)
    app.add_middleware(Guard, keys=keys, max_body_bytes=config.max_body_bytes)
    serving_keys.register(app, keys)
    web.register(app, engine, ctx)
    app.state.engine, app.state.ctx = engine, ctx

    @app.get("/health")
    async def health() -> JSONResponse:
        s = engine.stats
        body = {"status": "ok" if engine.dead is None else "error", "num_requests_running": s.num_running,
                "num_requests_waiting": s.num_waiting, "kv_used_blocks": s.num_used_blocks}
        return JSONResponse(body, status_code=200 if engine.dead is None else 503)

    @app.get("/version")
    async def version() -> dict:
        return {"version": __version__}

    @app.get("/metrics")
    async def metrics() -> Response:
        if engine.metrics is None:
            return Response(b"", media_type=CONTENT_TYPE)
        return Response(engine.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models() -> dict:
        upstream = await gateway.upstream_models() if gateway is not None else []
        return {"object": "list", "data": [{"id": ctx.model_name, "object": "model", "created": ctx.created,
                                            "owned_by": "hearth", "root": ctx.model_path, "parent": None,
                                            "max_model_len": ctx.max_model_len}, *upstream]}

    @app.post("/v1/completions")
    async def completions(raw: Request):
        body = await parse_body(raw, CompletionRequest)
        if gateway is not None:
            return await gateway.handle(raw, body, create_completion)
        return await create_completion(ctx, body, raw)

    @app.post("/v1/chat/completions")
    async def chat_completions(raw: Request):
        body = await parse_body(raw, ChatCompletionRequest)
        if gateway is not None:
            return await gateway.handle(raw, body, create_chat_completion)
        return await create_chat_completion(ctx, body, raw)

    register_pooling_routes(app, ctx)

    @app.post("/tokenize")
    async def tokenize(raw: Request) -> dict:
        return serving_tokenize.tokenize(ctx, await parse_body(raw, TokenizeRequest))

    @app.post("/detokenize")
    async def detokenize(raw: Request) -> dict:
        return serving_tokenize.detokenize(ctx, await parse_body(raw, DetokenizeRequest))

    serving_responses.register(app, ctx, parse_body)  # POST /v1/responses, GET/DELETE /v1/responses/{id}
    serving_anthropic.register(app, ctx, parse_body)  # POST /v1/messages, /v1/messages/count_tokens
    ollama_serving.register(app, ctx, parse_body)  # Ollama's /api/*
    return app
