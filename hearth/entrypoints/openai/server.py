"""The FastAPI app: thin routes over the serving layer, an ASGI guard for API keys and body size, lifespan."""
from __future__ import annotations

import asyncio
import hmac
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
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hearth import __version__
from hearth.engine.async_engine import AsyncEngine
from hearth.entrypoints.openai import serving_tokenize
from hearth.entrypoints.openai.errors import APIError, error_body, install_handlers
from hearth.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from hearth.entrypoints.openai.serving_chat import create_chat_completion
from hearth.entrypoints.openai.serving_common import ServingContext
from hearth.entrypoints.openai.serving_completion import create_completion
from hearth.metrics import CONTENT_TYPE

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
_PROTECTED = ("/v1/", "/tokenize", "/detokenize")  # /health, /version, /metrics stay open (probes, scrapers)

logger = logging.getLogger("hearth")


@dataclass
class ServerConfig:
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    drain_timeout: float = 30.0


class _BodyTooLarge(StarletteHTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than the limit of {limit} bytes")


class Guard:
    """Pure ASGI middleware (so streaming and disconnects pass through untouched): API key, then body size."""

    def __init__(self, app: ASGIApp, api_key: str | None, max_body_bytes: int) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode() if api_key else None
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if self.expected is not None and scope["path"].startswith(_PROTECTED):
            given = headers.get(b"authorization", b"")
            # NOTE: constant-time compare, so timing does not leak how much of the key matched.
            if not hmac.compare_digest(given, self.expected):
                return await _reply(send, 401, error_body("invalid or missing API key: send "
                                                          "'Authorization: Bearer <key>'", "invalid_request_error",
                                                          None, "invalid_api_key"))
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return await _reply(send, 413, error_body(f"the request body is larger than the limit of "
                                                      f"{self.max_body_bytes} bytes", "invalid_request_error",
                                                      None, "request_too_large"))
        seen = 0

        async def counted() -> Message:  # chunked bodies carry no content-length: count as they arrive
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    raise _BodyTooLarge(self.max_body_bytes)
            return message

        await self.app(scope, counted, send)


async def _reply(send: Send, status: int, body: dict) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


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


def build_app(engine: AsyncEngine, ctx: ServingContext, config: ServerConfig) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI):
        engine.start()
        warm = asyncio.create_task(warm_when_idle(engine, ctx.tokenizer.warm_up))
        yield
        warm.cancel()
        # uvicorn has already drained in-flight HTTP requests by now (graceful shutdown on SIGTERM).
        engine.shutdown(config.drain_timeout)

    app = FastAPI(title="hearth", version=__version__, lifespan=lifespan)
    install_handlers(app)
    app.add_middleware(Guard, api_key=config.api_key, max_body_bytes=config.max_body_bytes)
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
        return {"object": "list", "data": [{"id": ctx.model_name, "object": "model", "created": ctx.created,
                                            "owned_by": "hearth", "root": ctx.model_path, "parent": None,
                                            "max_model_len": ctx.max_model_len}]}

    @app.post("/v1/completions")
    async def completions(raw: Request):
        body = await parse_body(raw, CompletionRequest)
        return await create_completion(ctx, body, raw)

    @app.post("/v1/chat/completions")
    async def chat_completions(raw: Request):
        body = await parse_body(raw, ChatCompletionRequest)
        return await create_chat_completion(ctx, body, raw)

    @app.post("/tokenize")
    async def tokenize(raw: Request) -> dict:
        return serving_tokenize.tokenize(ctx, await parse_body(raw, TokenizeRequest))

    @app.post("/detokenize")
    async def detokenize(raw: Request) -> dict:
        return serving_tokenize.detokenize(ctx, await parse_body(raw, DetokenizeRequest))

    return app
