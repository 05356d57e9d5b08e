"""POST /v1/embeddings (OpenAI's shape): input as a string, strings, token ids or lists of token ids; vectors as
float lists or base64 (little-endian float32, what the openai client asks for by default)."""
from __future__ import annotations

import base64
import time

import torch
from fastapi import Request

from hearth.entrypoints.openai.errors import APIError
from hearth.entrypoints.openai.protocol_pooling import EmbeddingInput, EmbeddingRequest
from hearth.entrypoints.openai.serving_common import ServingContext, new_id
from hearth.entrypoints.openai.serving_pooling import limit_of, run_pooling
from hearth.entrypoints.pooling_inputs import encode_ids, encode_text
from hearth.pooling_params import PoolingParams


def tokenize_inputs(ctx: ServingContext, value: EmbeddingInput, limit: int | None,
                    add_special_tokens: bool = True) -> list[list[int]]:
    if isinstance(value, str):
        value = [value]
    if not value:
        raise APIError(400, "input is empty: give at least one text or token list", param="input")
    if isinstance(value[0], int):
        return [encode_ids(value, limit)]
    out = []
    for item in value:
        if isinstance(item, str):
            out.append(encode_text(ctx.tokenizer, item, limit, add_special_tokens))
        else:
            out.append(encode_ids(item, limit))
    return out


def encode_vector(vec: torch.Tensor, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(vec.to(torch.float32).contiguous().numpy().astype("<f4").tobytes()).decode()
    return vec.tolist()


async def create_embedding(ctx: ServingContext, req: EmbeddingRequest, raw: Request) -> dict:
    ctx.check_model(req.model)
    limit = limit_of(ctx, req.truncate_prompt_tokens)
    prompts = tokenize_inputs(ctx, req.input, limit, req.add_special_tokens)
    params = PoolingParams("embed", req.normalize, req.dimensions)
    vectors, tokens = await run_pooling(ctx, raw, [(ids, params) for ids in prompts], "embd")
    data = [{"index": i, "object": "embedding", "embedding": encode_vector(v, req.encoding_format)}
            for i, v in enumerate(vectors)]
    return {"id": new_id("embd"), "object": "list", "created": int(time.time()), "model": ctx.model_name,
            "data": data, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
