"""POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API) over the chat path; errors on these
routes in Anthropic's shape: {"type": "error", "error": {"type", "message"}}."""
from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from hearth.entrypoints.openai.body import JSONTextError, openapi_body, parse_json
from hearth.entrypoints.openai.chat_drive import Tally, drive, run_whole
from hearth.entrypoints.openai.anthropic_protocol import CountTokensRequest, MessagesRequest, chat_request
from hearth.entrypoints.openai.errors import APIError, validation_message, anthropic_body
from hearth.entrypoints.openai.serving_chat import ChatRun, render_chat, start_chat
from hearth.entrypoints.openai.served_models import ServedModels
from hearth.entrypoints.openai.serving_tools import plan_tools


def _stop_reason(finish_reason: str | None, stop: int | str | None) -> tuple[str | None, str | None]:
    if finish_reason == "tool_calls":
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if isinstance(stop, str):
        return "stop_sequence", stop
    return "end_turn", None


def _new(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _input(arguments: str) -> dict[str, Any]:
    try:
        value = parse_json(arguments or "{}")
    except JSONTextError:
        return {}
    return value if isinstance(value, dict) else {}


def anthropic_error(status: int, message: str) -> JSONResponse:
    return JSONResponse(anthropic_body(status, message), status_code=status)


def _sse(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False, separators=(',', ':'))}\n\n"


class _Blocks:
    """Content blocks as they form in a stream, and the events that announce them."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # "text" | "thinking" | "tool_use"

    def _start(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self.close()
        self.index += 1
        self.open = block["type"]
        return [*events, {"type": "content_block_start", "index": self.index, "content_block": block}]

    def add(self, delta: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if delta.get("reasoning_content"):
            if self.open != "thinking":
                events += self._start({"type": "thinking", "thinking": "", "signature": ""})
            events.append({"type": "content_block_delta", "index": self.index,
                           "delta": {"type": "thinking_delta", "thinking": delta["reasoning_content"]}})
        if delta.get("content"):
            if self.open != "text":
                events += self._start({"type": "text", "text": ""})
            events.append({"type": "content_block_delta", "index": self.index,
                           "delta": {"type": "text_delta", "text": delta["content"]}})
        for call in delta.get("tool_calls") or []:
            fn = call.get("function") or {}
            if call.get("id") is not None:
                events += self._start({"type": "tool_use", "id": _new("toolu"), "name": fn.get("name", ""),
                                       "input": {}})
            if fn.get("arguments") and self.open == "tool_use":
                events.append({"type": "content_block_delta", "index": self.index,
                               "delta": {"type": "input_json_delta", "partial_json": fn["arguments"]}})
        return events

    def close(self) -> list[dict[str, Any]]:
        if self.open is None:
            return []
        self.open = None
        return [{"type": "content_block_stop", "index": self.index}]


class MessagesAPI:
    def __init__(self, models: ServedModels) -> None:
        self.models = models

    async def create(self, req: MessagesRequest, raw: Request):
        ctx = await self.models.context(req.model)
        thinking = req.thinking or {}
        budget = thinking.get("budget_tokens") if thinking.get("type") == "enabled" else None
        if budget is not None and (not isinstance(budget, int) or budget < 0):
            raise APIError(400, f"thinking.budget_tokens must be an integer >= 0, got {budget!r}")
        run = await start_chat(ctx, chat_request(req), "msg", budget)
        message_id = _new("msg")
        head = {"id": message_id, "type": "message", "role": "assistant", "model": ctx.model_name}
        if req.stream:
            return StreamingResponse(self._events(run, raw, head), media_type="text/event-stream")
        t = await run_whole(run.stream, raw, Tally())
        if t.aborted:
            return JSONResponse({}, status_code=499)
        message, reason = run.final_message(t.text, t.reason)
        content: list[dict[str, Any]] = []
        if message.get("reasoning_content"):
            content.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
        if message.get("content"):
            content.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls") or []:
            content.append({"type": "tool_use", "id": _new("toolu"), "name": call["function"]["name"],
                            "input": _input(call["function"]["arguments"])})
        stop_reason, stop_sequence = _stop_reason(reason, t.stop)
        return JSONResponse({**head, "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
                             # NOTE: Anthropic counts prompt tokens read from the cache apart from input_tokens
                             "usage": {"input_tokens": len(run.prompt_ids) - t.cached, "output_tokens": t.n_out,
                                       "cache_read_input_tokens": t.cached}})

    async def _events(self, run: ChatRun, raw: Request, head: dict[str, Any]) -> AsyncIterator[str]:
        start = {**head, "content": [], "stop_reason": None, "stop_sequence": None,
                 "usage": {"input_tokens": len(run.prompt_ids), "output_tokens": 0}}
        yield _sse({"type": "message_start", "message": start})
        yield _sse({"type": "ping"})
        blocks, t, reason = _Blocks(), Tally(), None
        try:
            async with aclosing(drive(run.stream, raw, t, run.choice_stream())) as outputs:
                async for delta, finished, finish_reason in outputs:
                    for event in blocks.add(delta):
                        yield _sse(event)
                    if finished:
                        reason = finish_reason
        except APIError as e:
            yield _sse({"type": "error", "error": {"type": "api_error", "message": e.message}})
            return
        if t.aborted:
            return
        for event in blocks.close():
            yield _sse(event)
        stop_reason, stop_sequence = _stop_reason(reason, t.stop)
        yield _sse({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                    "usage": {"output_tokens": t.n_out, "input_tokens": len(run.prompt_ids) - t.cached,
                              "cache_read_input_tokens": t.cached}})
        yield _sse({"type": "message_stop"})

    async def count_tokens(self, req: CountTokensRequest) -> dict[str, int]:
        ctx = await self.models.context(req.model)
        chat = chat_request(req)
        plan = plan_tools(chat)
        images = await ctx.images.load(chat.messages)  # (an image's tokens count: it is processed as for a message)
        image_text = ctx.token_text(ctx.images.placeholder_id) if images else None
        text = await render_chat(ctx, chat.messages, True, kwargs=chat.chat_template_kwargs, tools=plan,
                                 image_text=image_text)
        ids = ctx.tokenizer.encode(text, add_special_tokens=False)
        if images:
            ids, _ = await ctx.images.expand(ids, images)
        return {"input_tokens": len(ids)}


def register(app: FastAPI, models: ServedModels, parse_body: Callable[[Request, type], Awaitable[Any]]) -> None:
    api = MessagesAPI(models)

    async def anthropic_shaped(call: Awaitable[Any]) -> Any:
        try:
            return await call
        except APIError as e:
            return anthropic_error(e.status, e.message)
        except RequestValidationError as e:
            return anthropic_error(400, validation_message(e)[0])

    @app.post("/v1/messages", openapi_extra=openapi_body(MessagesRequest))
    async def messages(raw: Request):
        async def run() -> Any:
            return await api.create(await parse_body(raw, MessagesRequest), raw)
        return await anthropic_shaped(run())

    @app.post("/v1/messages/count_tokens", openapi_extra=openapi_body(CountTokensRequest))
    async def count_tokens(raw: Request):
        async def run() -> Any:
            return await api.count_tokens(await parse_body(raw, CountTokensRequest))
        return await anthropic_shaped(run())

