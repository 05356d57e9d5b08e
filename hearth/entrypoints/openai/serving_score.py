"""POST /v1/score (vLLM's shape) and /v1/rerank (Jina's / Cohere's, as vLLM serves it), for cross-encoders:
each (query, document) pair is one input, [CLS] query [SEP] document [SEP], scored by the classifier (sigmoid)."""
from __future__ import annotations

import time

from fastapi import Request

from hearth.entrypoints.openai.errors import APIError
from hearth.entrypoints.openai.protocol_pooling import RerankRequest, ScoreRequest
from hearth.entrypoints.openai.serving_common import ServingContext, new_id
from hearth.entrypoints.openai.serving_pooling import limit_of, run_pooling
from hearth.entrypoints.pooling_inputs import encode_pair
from hearth.pooling_params import PoolingParams


def score_pairs(first: str | list[str], second: str | list[str]) -> list[tuple[str, str]]:
    """1:1, 1:N (one query against every document) or N:N (pairwise), as vLLM pairs them."""
    firsts = [first] if isinstance(first, str) else list(first)
    seconds = [second] if isinstance(second, str) else list(second)
    if not firsts or not seconds:
        raise APIError(400, "text_1 and text_2 must not be empty", param="text_2")
    if len(firsts) == 1:
        return [(firsts[0], s) for s in seconds]
    if len(firsts) != len(seconds):
        raise APIError(400, f"text_1 has {len(firsts)} texts and text_2 {len(seconds)}: give one text_1, or as "
                            "many as text_2", param="text_1")
    return list(zip(firsts, seconds))


async def _score(ctx: ServingContext, raw: Request, pairs: list[tuple[str, str]], truncate: int | None,
                 prefix: str) -> tuple[list[float], int]:
    limit = limit_of(ctx, truncate)
    inputs = []
    for a, b in pairs:
        ids, types = encode_pair(ctx.tokenizer, a, b, limit)
        inputs.append((ids, PoolingParams("score", token_type_ids=types)))
    results, tokens = await run_pooling(ctx, raw, inputs, prefix)
    return [float(r[0]) for r in results], tokens


async def create_score(ctx: ServingContext, req: ScoreRequest, raw: Request) -> dict:
    ctx.check_model(req.model)
    first = req.text_1 if req.text_1 is not None else req.queries
    second = req.text_2 if req.text_2 is not None else req.documents
    if first is None or second is None:
        raise APIError(400, "give text_1 and text_2 (or queries and documents)",
                       param="text_1" if first is None else "text_2")
    scores, tokens = await _score(ctx, raw, score_pairs(first, second), req.truncate_prompt_tokens, "score")
    return {"id": new_id("score"), "object": "list", "created": int(time.time()), "model": ctx.model_name,
            "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


async def create_rerank(ctx: ServingContext, req: RerankRequest, raw: Request) -> dict:
    ctx.check_model(req.model)
    if not req.documents:
        raise APIError(400, "documents must not be empty", param="documents")
    scores, tokens = await _score(ctx, raw, [(req.query, d) for d in req.documents], req.truncate_prompt_tokens,
                                  "rerank")
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    if req.top_n is not None and req.top_n > 0:
        order = order[:req.top_n]
    results = []
    for i in order:
        item = {"index": i, "relevance_score": scores[i]}
        if req.return_documents:
            item["document"] = {"text": req.documents[i]}
        results.append(item)
    return {"id": new_id("rerank"), "model": ctx.model_name, "usage": {"total_tokens": tokens}, "results": results}
