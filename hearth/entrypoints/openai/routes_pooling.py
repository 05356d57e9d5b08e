"""The pooling routes on the app: /v1/embeddings, /v1/score, /v1/rerank (registered by build_app), each on the
model the request names."""
from __future__ import annotations

from fastapi import FastAPI, Request

from hearth.entrypoints.openai.body import openapi_body
from hearth.entrypoints.openai.protocol_pooling import EmbeddingRequest, RerankRequest, ScoreRequest
from hearth.entrypoints.openai.served_models import ServedModels
from hearth.entrypoints.openai.serving_embedding import create_embedding
from hearth.entrypoints.openai.serving_score import create_rerank, create_score


def register_pooling_routes(app: FastAPI, models: ServedModels) -> None:
    from hearth.entrypoints.openai.server import parse_body  # (server imports this module)

    @app.post("/v1/embeddings", openapi_extra=openapi_body(EmbeddingRequest))
    async def embeddings(raw: Request) -> dict:
        req = await parse_body(raw, EmbeddingRequest)
        return await create_embedding(await models.context(req.model), req, raw)

    @app.post("/v1/score", openapi_extra=openapi_body(ScoreRequest))
    async def score(raw: Request) -> dict:
        req = await parse_body(raw, ScoreRequest)
        return await create_score(await models.context(req.model), req, raw)

    @app.post("/v1/rerank", openapi_extra=openapi_body(RerankRequest))
    async def rerank(raw: Request) -> dict:
        req = await parse_body(raw, RerankRequest)
        return await create_rerank(await models.context(req.model), req, raw)
