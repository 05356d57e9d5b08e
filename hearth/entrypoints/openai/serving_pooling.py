"""What the pooling endpoints share: submit one engine request per input, collect each one's pooled tensor."""
from __future__ import annotations

import torch
from fastapi import Request

from hearth.engine.protocol import EngineRequest
from hearth.entrypoints.openai.errors import APIError
from hearth.entrypoints.openai.serving_common import Guarded, ServingContext, new_id
from hearth.entrypoints.pooling_inputs import truncation_limit
from hearth.pooling_params import PoolingParams


def limit_of(ctx: ServingContext, truncate_prompt_tokens: int | None) -> int | None:
    try:
        return truncation_limit(truncate_prompt_tokens, ctx.max_model_len)
    except ValueError as e:
        raise APIError(400, str(e), param="truncate_prompt_tokens") from None


async def run_pooling(ctx: ServingContext, raw: Request, inputs: list[tuple[list[int], PoolingParams]],
                      prefix: str) -> tuple[list[torch.Tensor], int]:
    """Returns (each input's pooled tensor in order, prompt tokens in all). An input that is too long is a 400
    naming truncate_prompt_tokens; a client gone mid-way aborts the rest (nothing is left queued)."""
    if not inputs:
        raise APIError(400, "input is empty: give at least one text or token list", param="input")
    base = new_id(prefix)
    subs = [EngineRequest(f"{base}-{i}", ids, params) for i, (ids, params) in enumerate(inputs)]
    try:
        stream = await ctx.generate(subs, prompt_param="input")
    except APIError as e:
        if e.param is None and e.status == 400:  # what this model cannot do with these inputs
            e.param = "input"
        raise
    index = {r.request_id: i for i, r in enumerate(subs)}
    results: list[torch.Tensor | None] = [None] * len(subs)
    tokens = 0
    async with Guarded(raw, stream) as outputs:
        async for out in outputs:
            results[index[out.request_id]] = out.pooled
            tokens += out.num_prompt_tokens
    if any(r is None for r in results):  # aborted: the client has gone, nobody reads this
        raise APIError(499, "the client closed the request")
    return results, tokens
