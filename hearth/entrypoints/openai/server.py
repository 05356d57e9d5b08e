"""The FastAPI app: thin routes over the serving layer, an ASGI guard for API keys and body size, lifespan."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response

from hearth import __version__, envs
from hearth.engine.async_engine import ShutdownError
from hearth.engine.protocol import EngineClient
from hearth.entrypoints.ollama import serving as ollama_serving
from hearth.entrypoints.openai import (
    admin_routes,
    lora_adapters,
    serving_anthropic,
    serving_keys,
    serving_responses,
    serving_tokenize,
)
from hearth.entrypoints.openai.body import install_openapi, openapi_body, parse_body  # noqa: F401 (re-export)
from hearth.entrypoints.openai.errors import error_body, install_handlers
from hearth.entrypoints.openai.gateway import Gateway
from hearth.entrypoints.openai.guard import Guard
from hearth.entrypoints.openai.lora_adapters import LoRAAdapters
from hearth.entrypoints.openai.lora_select import lora_choice, with_lora_scale
from hearth.entrypoints.openai.model_access import KeyScopedModels, may_see
from hearth.entrypoints.openai.model_router import HoldModels, ModelRouter
from hearth.entrypoints.openai.served_models import OneModel, ServedModels
from hearth.entrypoints.openai.site_guard import SiteConfig, SiteGuard
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
    allowed_hosts: list[str] | None = None  # None: any Host (see site_guard.default_allowed_hosts)
    allowed_origins: list[str] = field(default_factory=list)
    body_timeout: float = 30.0


async def warm_when_idle(engine: EngineClient, warm_up: Callable[[], object], idle_s: float = 5.0,
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


def build_app(engine: EngineClient | None, ctx: ServingContext | None, config: ServerConfig,
              gateway: Gateway | None = None, router: ModelRouter | None = None,
              adapters: LoRAAdapters | None = None) -> FastAPI:
    """One model (its client and context), or a ModelRouter (then engine and ctx are None: each model has its own,
    and the router answers /health). adapters: the one model's LoRA adapters (--enable-lora; a router's are its
    own)."""
    state = router if router is not None else engine  # what /health reports: dead, stats
    if router is not None:
        adapters = router.adapters
    @asynccontextmanager
    async def lifespan(_: FastAPI):
        if router is not None:  # worker processes: loaded (pinned) before serving, stopped after
            serving_keys.reload_on_sighup(keys)
            await router.start()
            yield
            await router.shutdown()
            return
        engine.start()
        serving_keys.reload_on_sighup(keys)
        warm = asyncio.create_task(warm_when_idle(engine, ctx.tokenizer.warm_up))
        yield
        warm.cancel()
        if gateway is not None:
            await gateway.aclose()
        # uvicorn has already drained in-flight HTTP requests by now (graceful shutdown on SIGTERM).
        engine.shutdown(config.drain_timeout)
        ctx.sandbox.shutdown()

    app = FastAPI(title="hearth", version=__version__, lifespan=lifespan)
    install_handlers(app)
    keys = serving_keys.key_ring(config.api_key, config.api_key_file,
                                 engine.metrics if router is None else router.front)
    if router is not None:  # (inside the key guard: a refused request holds nothing)
        app.add_middleware(HoldModels)
    app.add_middleware(Guard, keys=keys, max_body_bytes=config.max_body_bytes)
    if config.allowed_origins:  # outside the key guard: preflight requests carry no key
        app.add_middleware(CORSMiddleware, allow_origins=config.allowed_origins, allow_methods=["*"],
                           allow_headers=["*"])
    # NOTE: added last, so it is the outermost layer: refused hosts and origins never reach CORS or a route.
    app.add_middleware(SiteGuard, config=SiteConfig(config.allowed_hosts, config.allowed_origins,
                                                    config.body_timeout))
    install_openapi(app)
    serving_keys.register(app, keys)
    if router is not None:  # NOTE: before web.register: the router's /status answers for every model
        admin_routes.register(app, router)
    if router is None:
        web.register(app, engine, ctx)
    else:
        web.register_page(app)  # (its /status is the router's, registered above)
    app.state.engine, app.state.ctx = state, ctx

    # NOTE: every route reaches a model through `served`, which checks the request's key first (model_access)
    served: ServedModels = KeyScopedModels(OneModel(ctx, adapters) if router is None else router)  # (`models`: a route)
    context = served.context  # the request's model's ServingContext (an unknown name: 404)

    @app.exception_handler(ShutdownError)
    async def shutting_down(_: Request, exc: ShutdownError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), "server_error", None, "server_shutting_down"), status_code=503)

    @app.get("/health")
    async def health() -> JSONResponse:
        s = state.stats
        body = {"status": "ok" if state.dead is None else "error", "num_requests_running": s.num_running,
                "num_requests_waiting": s.num_waiting, "kv_used_blocks": s.num_used_blocks}
        return JSONResponse(body, status_code=200 if state.dead is None else 503)

    @app.get("/version")
    async def version() -> dict:
        return {"version": __version__}

    @app.get("/metrics")
    async def metrics() -> Response:
        if router is not None:
            return Response(await router.render_metrics(), media_type=CONTENT_TYPE)
        if engine.metrics is None:
            return Response(b"", media_type=CONTENT_TYPE)
        return Response(engine.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models() -> dict:
        if router is not None:
            listed = router.openai_list()
        else:
            upstream = await gateway.upstream_models() if gateway is not None else []
            listed = {"object": "list", "data": [{"id": ctx.model_name, "object": "model", "created": ctx.created,
                                                  "owned_by": "hearth", "root": ctx.model_name, "parent": None,
                                                  "max_model_len": ctx.max_model_len},
                                                 *(adapters.cards() if adapters is not None else []), *upstream]}
        return {**listed, "data": [m for m in listed["data"] if may_see(m["id"])]}

    async def generating_context(body: CompletionRequest | ChatCompletionRequest) -> ServingContext:
        """The request's model, or the adapter its llama-server `lora` list applies, at that list's scale."""
        name, scale = lora_choice(body.lora, body.model, adapters)
        body.model = name  # (the serving layer checks the body's model against the context's name)
        return with_lora_scale(await context(name), scale)

    @app.post("/v1/completions", openapi_extra=openapi_body(CompletionRequest))
    async def completions(raw: Request):
        body = await parse_body(raw, CompletionRequest)
        if gateway is not None:
            lora_choice(body.lora, body.model, None)  # (no adapters behind a gateway: a `lora` list is a 400)
            return await gateway.handle(raw, body, create_completion)
        return await create_completion(await generating_context(body), body, raw)

    @app.post("/v1/chat/completions", openapi_extra=openapi_body(ChatCompletionRequest))
    async def chat_completions(raw: Request):
        body = await parse_body(raw, ChatCompletionRequest)
        if gateway is not None:
            lora_choice(body.lora, body.model, None)
            return await gateway.handle(raw, body, create_chat_completion)
        return await create_chat_completion(await generating_context(body), body, raw)

    if adapters is not None:
        @app.get("/lora-adapters")
        async def lora_adapter_list() -> list[dict]:
            """llama-server's listing: each adapter's id (for a request's `lora` list), name, path and scale."""
            return [row for row in adapters.llama_listing() if may_see(row["name"])]

    register_pooling_routes(app, served)
    if adapters is not None and envs.allow_runtime_lora_updating():  # (vLLM's opt-in: off, no route reads a path)
        lora_adapters.register(app, adapters)  # POST /v1/load_lora_adapter, /v1/unload_lora_adapter

    @app.post("/tokenize", openapi_extra=openapi_body(TokenizeRequest))
    async def tokenize(raw: Request) -> dict:
        body = await parse_body(raw, TokenizeRequest)
        return await serving_tokenize.tokenize(await context(body.model), body)

    @app.post("/detokenize", openapi_extra=openapi_body(DetokenizeRequest))
    async def detokenize(raw: Request) -> dict:
        body = await parse_body(raw, DetokenizeRequest)
        return serving_tokenize.detokenize(await context(body.model), body)

    serving_responses.register(app, served, parse_body)  # POST /v1/responses, GET/DELETE /v1/responses/{id}
    serving_anthropic.register(app, served, parse_body)  # POST /v1/messages, /v1/messages/count_tokens
    ollama_serving.register(app, served, parse_body)  # Ollama's /api/*
    return app
