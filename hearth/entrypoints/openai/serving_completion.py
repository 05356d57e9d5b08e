"""POST /v1/completions: one engine request per prompt (each with n sequences); choice index = prompt * n + i."""
from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from hearth.engine.outputs import StepOutput
from hearth.engine.protocol import EngineRequest
from hearth.entrypoints.openai.errors import APIError, bad_request
from hearth.entrypoints.openai.fim import fim_prompt_ids
from hearth.errors import ParamError
from hearth.entrypoints.openai.protocol import CompletionRequest
from hearth.entrypoints.openai.serving_common import (
    SAMPLING_PARAMS,
    Guarded,
    ServingContext,
    new_id,
    sse,
    sse_stream,
    usage,
)
from hearth.layers.sampler import TokenLogprobs


@dataclass(eq=False)
class _Choice:
    prompt_index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    started: bool = False  # streaming: the echo prefix went out
    text_offset: int = 0  # streaming: characters already sent, for logprobs' text_offset


def prompts_of(ctx: ServingContext, req: CompletionRequest) -> list[tuple[str, list[int]]]:
    """The prompt field as (text, token ids) pairs: a string, strings, token ids, or lists of token ids."""
    p = req.prompt
    if isinstance(p, str):
        items: list = [p]
    elif p and isinstance(p[0], int):
        items = [p]
    else:
        items = list(p)
    if not items:
        raise APIError(400, "prompt must not be empty", param="prompt")
    out = []
    for item in items:
        if isinstance(item, str):
            out.append((item, ctx.tokenizer.encode(item, add_special_tokens=req.add_special_tokens)))
        else:
            if any(not 0 <= t < ctx.tokenizer.vocab_size for t in item):
                raise APIError(400, f"prompt token ids must be in [0, {ctx.tokenizer.vocab_size})", param="prompt")
            out.append((ctx.tokenizer.decode(item, skip_special_tokens=False), list(item)))
    return out


def _logprobs_block(ctx: ServingContext, entries: list[TokenLogprobs | None], token_ids: list[int],
                    offset: int) -> dict:
    """The legacy completions logprobs object; entries[i] is None for a position without logprobs (prompt start)."""
    tokens, token_lps, tops, offsets = [], [], [], []
    for tok, lp in zip(token_ids, entries):
        text = ctx.token_text(tok)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if lp is None:
            token_lps.append(None)
            tops.append(None)
        else:
            token_lps.append(lp.logprob)
            top = {ctx.token_text(t): v for t, v in lp.top}
            top.setdefault(text, lp.logprob)
            tops.append(top)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


async def create_completion(ctx: ServingContext, req: CompletionRequest, raw: Request):
    ctx.check_model(req.model)
    if req.best_of is not None and req.best_of != 1:
        raise APIError(400, "best_of is not supported by this server: use n to get several completions",
                       param="best_of")
    prompts = prompts_of(ctx, req)
    if req.suffix is not None:  # fill-in-the-middle: each prompt is the prefix
        if any(not isinstance(p, str) for p in ([req.prompt] if isinstance(req.prompt, str) else req.prompt)):
            raise APIError(400, "suffix needs the prompt as text, not token ids", param="suffix")
        prompts = [(text, fim_prompt_ids(ctx.fim, ctx.tokenizer, text, req.suffix)) for text, _ in prompts]
    prompt_lp = req.prompt_logprobs
    if req.echo and req.logprobs is not None and prompt_lp is None:
        prompt_lp = req.logprobs  # echo with logprobs returns the prompt's logprobs too
    try:
        spec, spec_param = req.structured_params()
    except ParamError as e:
        raise APIError(400, str(e), param=e.param) from None
    try:
        params = req.sampling_params(req.max_tokens, req.logprobs, prompt_lp, structured_outputs=spec,
                                     defaults=ctx.sampling_defaults,
                                     room=ctx.max_model_len - max(len(ids) for _, ids in prompts))
    except ValueError as e:
        raise bad_request(e, SAMPLING_PARAMS) from None
    await ctx.compile_structured(spec, spec_param)
    request_id = new_id("cmpl")
    subs = [EngineRequest(f"{request_id}-{i}", ids, params) for i, (_, ids) in enumerate(prompts)]
    prompt_of = {r.request_id: i for i, r in enumerate(subs)}
    stream = await ctx.generate(subs)
    n = params.n
    choices = [_Choice(i // n) for i in range(len(prompts) * n)]
    prompt_lps: dict[int, list[TokenLogprobs | None]] = {}
    head = {"id": request_id, "object": "text_completion", "created": int(time.time()), "model": ctx.model_name}

    def prefix(choice: _Choice) -> tuple[str, dict | None]:
        """What echo puts before the generated text: the prompt, and its logprobs."""
        text, ids = prompts[choice.prompt_index]
        lp = None
        if req.logprobs is not None:
            entries = prompt_lps.get(choice.prompt_index) or [None] * len(ids)
            lp = _logprobs_block(ctx, entries, ids, 0)
        return text, lp

    def merge(a: dict | None, b: dict | None) -> dict | None:
        if a is None or b is None:
            return a or b
        return {k: a[k] + b[k] for k in a}

    def update(out: StepOutput) -> tuple[int, _Choice]:
        pi = prompt_of[out.request_id]
        if out.prompt_logprobs is not None:
            prompt_lps.setdefault(pi, out.prompt_logprobs)
        index = pi * n + out.index
        c = choices[index]
        if out.finished:
            c.finish_reason, c.stop_reason = out.finish_reason, out.stop_reason
        return index, c

    if req.stream:
        continuous = bool(req.stream_options and req.stream_options.continuous_usage_stats)
        n_prompt = sum(len(ids) for _, ids in prompts)

        async def chunks() -> AsyncIterator[str]:
            async with Guarded(raw, stream) as outputs:
                async for out in outputs:
                    index, c = update(out)
                    text, lp = out.new_text, None
                    if req.logprobs is not None:
                        lp = _logprobs_block(ctx, out.new_logprobs, out.new_token_ids, c.text_offset)
                    if req.echo and not c.started:
                        ptext, plp = prefix(c)
                        text, lp = ptext + text, merge(plp, lp)
                        if lp is not None:  # generated offsets follow the prompt's
                            lp["text_offset"] = _offsets(lp["tokens"])
                    c.started = True
                    c.text_offset += len(text)
                    c.token_ids.extend(out.new_token_ids)
                    chunk = {**head, "choices": [{"index": index, "text": text, "logprobs": lp,
                                                  "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}]}
                    if continuous:
                        chunk["usage"] = usage(n_prompt, sum(len(c.token_ids) for c in choices))
                    yield sse(chunk)
                if req.include_usage and not stream.aborted:
                    yield sse({**head, "choices": [], "usage": usage(sum(len(ids) for _, ids in prompts),
                                                                     sum(len(c.token_ids) for c in choices))})
        return StreamingResponse(sse_stream(chunks()), media_type="text/event-stream")

    async with Guarded(raw, stream) as outputs:
        async for out in outputs:
            _, c = update(out)
            c.text += out.new_text
            c.token_ids.extend(out.new_token_ids)
            c.logprobs.extend(out.new_logprobs)
    if stream.aborted:
        return JSONResponse({}, status_code=499)  # the client is gone; nobody reads this
    body_choices = []
    for i, c in enumerate(choices):
        text, lp = c.text, None
        if req.logprobs is not None:
            lp = _logprobs_block(ctx, c.logprobs, c.token_ids, 0)
        if req.echo:
            ptext, plp = prefix(c)
            text, lp = ptext + text, merge(plp, lp)
        if lp is not None:
            lp["text_offset"] = _offsets(lp["tokens"])
        body_choices.append({"index": i, "text": text, "logprobs": lp, "finish_reason": c.finish_reason,
                             "stop_reason": c.stop_reason})
    return JSONResponse({**head, "choices": body_choices,
                         "usage": usage(sum(len(ids) for _, ids in prompts), sum(len(c.token_ids) for c in choices))})


def _offsets(tokens: list[str]) -> list[int]:
    out, pos = [], 0
    for t in tokens:
        out.append(pos)
        pos += len(t)
    return out
