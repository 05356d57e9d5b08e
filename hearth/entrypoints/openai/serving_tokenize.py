"""POST /tokenize and /detokenize (vLLM's shapes)."""
from __future__ import annotations

import asyncio

from hearth.entrypoints.openai.errors import APIError
from hearth.entrypoints.openai.protocol import DetokenizeRequest, TokenizeRequest
from hearth.entrypoints.openai.serving_chat import render_chat
from hearth.entrypoints.openai.serving_common import ServingContext


async def tokenize(ctx: ServingContext, req: TokenizeRequest) -> dict:
    ctx.check_model(req.model)
    if (req.prompt is None) == (req.messages is None):
        raise APIError(400, "give exactly one of prompt or messages", param="prompt")
    if req.messages is not None:
        text = await render_chat(ctx, req.messages, req.add_generation_prompt)
        ids = await asyncio.to_thread(ctx.tokenizer.encode, text, False)
    else:
        ids = await asyncio.to_thread(ctx.tokenizer.encode, req.prompt, req.add_special_tokens)
    out: dict = {"count": len(ids), "max_model_len": ctx.max_model_len, "tokens": ids}
    if req.return_token_strs:
        out["token_strs"] = ctx.tokenizer.convert_ids_to_tokens(ids)
    return out


def detokenize(ctx: ServingContext, req: DetokenizeRequest) -> dict:
    ctx.check_model(req.model)
    vocab = ctx.tokenizer.vocab_size
    bad = [t for t in req.tokens if not 0 <= t < vocab]
    if bad:
        raise APIError(400, f"token ids must be in [0, {vocab}); got {bad[:5]}", param="tokens")
    return {"prompt": ctx.tokenizer.decode(req.tokens, skip_special_tokens=False)}
