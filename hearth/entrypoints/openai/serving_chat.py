"""POST /v1/chat/completions: chat template -> token ids -> one engine request with n sequences. start_chat and
ChatRun are the path the other chat-shaped APIs (Responses, Anthropic Messages, Ollama) share."""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from hearth.engine.async_engine import RequestStream
from hearth.engine.protocol import EngineRequest
from hearth.entrypoints.openai.errors import APIError, bad_request
from hearth.errors import ParamError
from hearth.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage
from hearth.entrypoints.openai.serving_common import (
    SAMPLING_PARAMS,
    Guarded,
    ServingContext,
    new_id,
    sse,
    sse_stream,
    usage,
    wait_disconnect,
)
from hearth.entrypoints.openai.reasoning_parser import ReasoningParser, ReasoningStream
from hearth.entrypoints.openai.template_sandbox import TemplateLimitError, run_watched
from hearth.entrypoints.openai.serving_tools import ToolPlan, ToolStream, finish_message, plan_tools
from hearth.layers.sampler import TokenLogprobs
from hearth.sampling_params import SamplingParams


async def render_chat(ctx: ServingContext, messages: list[ChatMessage], add_generation_prompt: bool,
                      continue_final_message: bool = False, chat_template: str | None = None,
                      kwargs: dict | None = None, tools: ToolPlan | None = None,
                      raw: Request | None = None, image_text: str | None = None) -> str:
    """Apply the chat template off the event loop (a request's own template in the sandbox worker, see
    template_sandbox); a bad message list or template, or one over a limit, is the user's error (400). image_text:
    the model's image placeholder, put where each image part is (None: image parts are refused)."""
    from jinja2 import TemplateError

    try:
        dicts = [m.as_dict(image_text) for m in messages]
        template = chat_template  # (None: the tokenizer's own, which --chat-template set at load)
        if tools is not None and tools.tools:
            dicts = tools.add_to_messages(dicts, template or ctx.tokenizer.chat_template)
        render_kw = ctx.tokenizer.chat_render_kwargs(
            dicts, add_generation_prompt=add_generation_prompt,
            tools=tools.tools if tools is not None and tools.tools else None, chat_template=template,
            continue_final_message=continue_final_message, **(kwargs or {}))
        max_chars = ctx.max_prompt_chars
        if chat_template is None or ctx.tokenizer.is_own_template(chat_template):
            def work(_: object) -> str:
                return render_local(render_kw, max_chars)
        else:
            def work(cancelled: object) -> str:
                return ctx.sandbox.render(render_kw, max_chars, cancelled)
        return await run_watched(work, None if raw is None else lambda: wait_disconnect(raw))
    except TemplateLimitError as e:
        raise APIError(400, f"chat_template: {e}", param="chat_template", code="chat_template_limit") from None
    except (ValueError, TemplateError, TypeError) as e:
        raise APIError(400, f"cannot apply the chat template: {e}", param="messages") from None


def render_local(render_kw: dict, max_chars: int) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    text = render_jinja_template(**render_kw)[0][0]
    if len(text) > max_chars:
        raise TemplateLimitError(f"the rendered chat template is longer than the limit of {max_chars} characters")
    return text


def _logprob_entry(ctx: ServingContext, token_id: int, logprob: float) -> dict:
    text = ctx.token_text(token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def _logprobs_content(ctx: ServingContext, entries: list[TokenLogprobs]) -> list[dict]:
    return [{**_logprob_entry(ctx, lp.token_id, lp.logprob),
             "top_logprobs": [_logprob_entry(ctx, t, v) for t, v in lp.top]} for lp in entries]


@dataclass
class ChatRun:
    """A chat request submitted to the engine: what every chat-shaped API (chat completions, Responses, Anthropic
    Messages, Ollama) formats its answer from."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    plan: ToolPlan
    stream: RequestStream
    reasoning: ReasoningParser | None = None
    starts_in_reasoning: bool = False

    def choice_stream(self) -> ChoiceStream:
        return ChoiceStream(self.plan, ReasoningStream(self.starts_in_reasoning) if self.reasoning else None)

    def final_message(self, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
        """The whole assistant message (reasoning split off, tool calls parsed) and its finish_reason."""
        reasoning = None
        if self.reasoning is not None:
            reasoning, text = self.reasoning.split(text, self.starts_in_reasoning)
        message, reason = finish_message(self.plan, text, finish_reason)
        if reasoning is not None:
            message["reasoning_content"] = message["reasoning"] = reasoning
        return message, reason


@dataclass
class ChoiceStream:
    """One sequence of a streamed chat: text deltas -> chat deltas (reasoning_content, content, tool_calls)."""

    plan: ToolPlan
    reasoning: ReasoningStream | None
    tools: ToolStream = field(init=False)

    def __post_init__(self) -> None:
        self.tools = ToolStream(self.plan)

    def delta(self, new_text: str, finished: bool) -> dict:
        thought = ""
        if self.reasoning is not None:
            thought, new_text = self.reasoning.feed(new_text)
            if finished:
                more_r, more_c = self.reasoning.finish()
                thought, new_text = thought + more_r, new_text + more_c
        delta = self.tools.delta(new_text, finished)
        if thought:
            delta = {"reasoning_content": thought, "reasoning": thought, **delta}
        return delta

    def finish_reason(self, reason: str | None) -> str | None:
        return self.tools.finish_reason(reason)


async def start_chat(ctx: ServingContext, req: ChatCompletionRequest, id_prefix: str = "chatcmpl",
                     reasoning_budget: int | None = None, raw: Request | None = None) -> ChatRun:
    """Validate, render, tokenize and submit a chat request (user errors are APIError 4xx). reasoning_budget:
    this request's thinking budget (Anthropic's thinking.budget_tokens), instead of --reasoning-budget."""
    ctx.check_model(req.model)
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs requires logprobs to be true", param="top_logprobs")
    if req.top_logprobs is not None and not 0 <= req.top_logprobs <= 20:
        raise APIError(400, f"top_logprobs must be in [0, 20], got {req.top_logprobs}", param="top_logprobs")
    plan = plan_tools(req)
    try:
        spec, spec_param = req.structured_params()
    except ParamError as e:
        raise APIError(400, str(e), param=e.param) from None
    if plan.constraint is not None:
        if spec is not None:
            raise APIError(400, f"tool_choice {plan.mode!r} cannot be combined with {spec_param}",
                           param="tool_choice")
        spec, spec_param = plan.constraint, "tools"  # NOTE: the grammar comes from the functions' schemas
    images = await ctx.images.load(req.messages)  # (a 400 for a bad image, before any template or token work)
    image_text = ctx.token_text(ctx.images.placeholder_id) if images else None
    text = await render_chat(ctx, req.messages, req.add_generation_prompt, req.continue_final_message,
                             req.chat_template, req.chat_template_kwargs, plan, raw, image_text)
    ids = await asyncio.to_thread(ctx.tokenizer.encode, text, req.add_special_tokens)
    mm_inputs = None
    if images:
        ids, mm_inputs = await ctx.images.expand(ids, images)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    try:
        params = req.sampling_params(max_tokens, logprobs, structured_outputs=spec, defaults=ctx.sampling_defaults,
                                     room=ctx.max_model_len - len(ids))
    except ValueError as e:
        err = bad_request(e, SAMPLING_PARAMS)
        if err.param == "max_tokens" and req.max_completion_tokens is not None:
            err.param = "max_completion_tokens"
        raise err from None
    reasoning = ctx.reasoning_parser
    state = "done"
    if reasoning is not None:
        opened = text
        if req.add_generation_prompt and not req.continue_final_message:
            # NOTE: only the generation prompt tells whether this turn's thinking is open: earlier assistant turns
            # in the history may hold closed <think> blocks of their own.
            head = await render_chat(ctx, req.messages, False, False, req.chat_template, req.chat_template_kwargs,
                                     plan, raw, image_text)
            opened = text[len(head):] if text.startswith(head) else text
        state = reasoning.initial_state(opened)
    starts = state == "think"
    if reasoning is not None:
        params = ctx.reasoning_params(params, state, reasoning_budget)
    await ctx.compile_structured(spec, spec_param)
    request_id = new_id(id_prefix)
    stream = await ctx.generate([EngineRequest(request_id, ids, params, mm_inputs=mm_inputs)],
                                prompt_param="messages")
    return ChatRun(request_id, ids, params, plan, stream, reasoning, starts)


async def create_chat_completion(ctx: ServingContext, req: ChatCompletionRequest, raw: Request):
    run = await start_chat(ctx, req, raw=raw)
    request_id, ids, stream = run.request_id, run.prompt_ids, run.stream
    n = run.params.n
    plan = run.plan
    head = {"id": request_id, "object": "chat.completion.chunk" if req.stream else "chat.completion",
            "created": int(time.time()), "model": ctx.model_name}

    if req.stream:
        continuous = bool(req.stream_options and req.stream_options.continuous_usage_stats)

        async def chunks() -> AsyncIterator[str]:
            completion_tokens = 0
            choice_streams = [run.choice_stream() for _ in range(n)]
            async with Guarded(raw, stream) as outputs:
                for i in range(n):
                    first = {**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                  "logprobs": None, "finish_reason": None}]}
                    if continuous:
                        first["usage"] = usage(len(ids), 0)
                    yield sse(first)
                async for out in outputs:
                    completion_tokens += len(out.new_token_ids)
                    lp = {"content": _logprobs_content(ctx, out.new_logprobs)} if req.logprobs else None
                    cs = choice_streams[out.index]
                    delta = cs.delta(out.new_text, out.finished)
                    if not delta and plan.mode is None and not out.finished:
                        delta = {"content": ""}
                    if not delta and not out.finished and lp is None:
                        continue  # held back (a tool call in progress): nothing to send yet
                    choice = {"index": out.index, "delta": delta, "logprobs": lp,
                              "finish_reason": cs.finish_reason(out.finish_reason) if out.finished else None}
                    if out.finished:
                        choice["stop_reason"] = out.stop_reason
                    chunk = {**head, "choices": [choice]}
                    if continuous:
                        chunk["usage"] = usage(len(ids), completion_tokens)
                    yield sse(chunk)
            if req.include_usage and not stream.aborted:
                yield sse({**head, "choices": [], "usage": usage(len(ids), completion_tokens)})
        return StreamingResponse(sse_stream(chunks()), media_type="text/event-stream")

    texts = [""] * n
    token_counts = [0] * n
    lps: list[list[TokenLogprobs]] = [[] for _ in range(n)]
    finish: list[tuple[str | None, int | str | None]] = [(None, None)] * n
    cached = 0
    async with Guarded(raw, stream) as outputs:
        async for out in outputs:
            texts[out.index] += out.new_text
            token_counts[out.index] += len(out.new_token_ids)
            lps[out.index].extend(out.new_logprobs)
            cached = max(cached, out.num_cached_tokens)
            if out.finished:
                finish[out.index] = (out.finish_reason, out.stop_reason)
    if stream.aborted:
        return JSONResponse({}, status_code=499)  # the client is gone; nobody reads this
    choices = []
    for i in range(n):
        message, reason = run.final_message(texts[i], finish[i][0])
        choices.append({"index": i, "message": message,
                        "logprobs": {"content": _logprobs_content(ctx, lps[i])} if req.logprobs else None,
                        "finish_reason": reason, "stop_reason": finish[i][1]})
    return JSONResponse({**head, "choices": choices, "usage": usage(len(ids), sum(token_counts), cached)})
