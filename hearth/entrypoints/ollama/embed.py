"""Ollama's embedding routes: POST /api/embed (L2-normalized vectors, as Ollama returns them) and the older
POST /api/embeddings (one prompt). Errors in Ollama's shape, {"error": "..."}, which its clients read."""
from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from hearth.entrypoints.openai.body import openapi_body
from hearth.entrypoints.openai.errors import APIError
from hearth.entrypoints.openai.protocol_pooling import OllamaEmbeddingsRequest, OllamaEmbedRequest
from hearth.entrypoints.openai.serving_common import ServingContext
from hearth.entrypoints.openai.serving_embedding import tokenize_inputs
from hearth.entrypoints.openai.serving_pooling import run_pooling
from hearth.pooling_params import PoolingParams


def _error(e: APIError | RequestValidationError) -> JSONResponse:
    if isinstance(e, APIError):
        return JSONResponse({"error": e.message}, status_code=e.status)
    first = (e.errors() or [{}])[0]
    where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
    return JSONResponse({"error": f"{where}: {first.get('msg', 'invalid request')}"}, status_code=400)


def register(app: FastAPI, context: Callable[[str | None], Awaitable[ServingContext]],
             parse_body: Callable[[Request, type], Awaitable[Any]]) -> None:
    """context: the model a request names, as Ollama's clients name it (OllamaAPI.context)."""

    @app.post("/api/embed", openapi_extra=openapi_body(OllamaEmbedRequest))
    async def embed(raw: Request):
        t0 = time.perf_counter_ns()
        try:
            req = await parse_body(raw, OllamaEmbedRequest)
            ctx = await context(req.model)
            prompts = tokenize_inputs(ctx, req.input, ctx.max_model_len if req.truncate else None)
            params = PoolingParams("embed", True, req.dimensions)
            vectors, tokens = await run_pooling(ctx, raw, [(ids, params) for ids in prompts], "embed")
        except (APIError, RequestValidationError) as e:
            return _error(e)
        return {"model": req.model or ctx.model_name, "embeddings": [v.tolist() for v in vectors],
                "total_duration": time.perf_counter_ns() - t0, "load_duration": 0, "prompt_eval_count": tokens}

    @app.post("/api/embeddings", openapi_extra=openapi_body(OllamaEmbeddingsRequest))
    async def embeddings(raw: Request):
        try:
            req = await parse_body(raw, OllamaEmbeddingsRequest)
            ctx = await context(req.model)
            prompts = tokenize_inputs(ctx, req.prompt, ctx.max_model_len)
            vectors, _ = await run_pooling(ctx, raw, [(prompts[0], PoolingParams("embed"))], "embed")
        except (APIError, RequestValidationError) as e:
            return _error(e)
        return {"embedding": vectors[0].tolist()}
