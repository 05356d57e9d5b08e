"""POST /v1/responses (OpenAI's Responses API) over the chat path: input items -> chat messages -> start_chat; the
answer as output items (reasoning, message, function_call), whole or as the Responses event stream."""
from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import StrictBool, StrictInt, ValidationError

from hearth.engine.async_engine import EngineDeadError
from hearth.entrypoints.openai.errors import APIError
from hearth.entrypoints.openai.protocol import ChatCompletionRequest, OpenAIModel
from hearth.entrypoints.openai.serving_chat import ChatRun, start_chat
from hearth.entrypoints.openai.serving_common import Guarded, ServingContext

# vLLM's extra chat fields a Responses or Messages request may carry; the chat path checks their types.
CHAT_EXTRAS = ("top_k", "min_p", "seed", "stop", "stop_token_ids", "repetition_penalty", "presence_penalty",
               "frequency_penalty", "ignore_eos", "min_tokens", "chat_template", "structured_outputs")
STORE_SIZE = 1000  # responses kept for previous_response_id (oldest dropped first)


class ResponsesRequest(OpenAIModel):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: StrictInt | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: StrictBool = False
    store: StrictBool = True
    previous_response_id: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = True
    text: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    user: str | None = None


def _text_of(content: str | list[dict[str, Any]] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        if part.get("type") not in ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
            raise APIError(400, f"input content parts of type {part.get('type')!r} are not supported (text only)",
                           param="input")
        texts.append(part["text"])
    return "\n".join(texts)


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Responses input as chat messages: message items, function_call items (merged into the assistant turn
    that made them) and function_call_output items (tool messages)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise APIError(400, f"input message role must be user, system, developer or assistant, got {role!r}",
                               param="input")
            out.append({"role": role, "content": _text_of(item.get("content"))})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") is not None:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                        "content": output if isinstance(output, str) else json.dumps(output)})
        elif kind == "reasoning":
            continue  # the model's earlier thinking is not fed back (chat templates drop it too)
        else:
            raise APIError(400, f"input items of type {kind!r} are not supported", param="input")
    if not out:
        raise APIError(400, "input must not be empty", param="input")
    return out


def _chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    out = []
    for t in tools:
        if t.get("type") != "function":
            raise APIError(400, f"tools of type {t.get('type')!r} are not supported (function tools only)",
                           param="tools")
        out.append({"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters", "strict")
                                                     if t.get(k) is not None}})
    return out


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if not fmt or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name"), "schema": fmt.get("schema"),
                                                       "strict": fmt.get("strict")}}
    return {"type": fmt.get("type")}


class ResponseStore:
    """The last STORE_SIZE stored responses (body, and the conversation up to and with it) in memory."""

    def __init__(self, size: int = STORE_SIZE) -> None:
        self.size = size
        self.items: OrderedDict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = OrderedDict()

    def get(self, response_id: str, param: str | None = "previous_response_id") -> tuple[dict, list[dict]]:
        if response_id not in self.items:
            raise APIError(404, f"no stored response has the id {response_id!r} (responses made with store false, "
                                f"and all but the last {self.size}, are not kept)", param=param,
                           code="response_not_found")
        return self.items[response_id]

    def put(self, response_id: str, body: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        self.items[response_id] = (body, messages)
        while len(self.items) > self.size:
            self.items.popitem(last=False)

    def delete(self, response_id: str) -> None:
        self.get(response_id, None)
        del self.items[response_id]


def _chat_request(req: ResponsesRequest, messages: list[dict[str, Any]]) -> ChatCompletionRequest:
    body: dict[str, Any] = {"model": req.model, "messages": messages, "max_tokens": req.max_output_tokens,
                            "tools": _chat_tools(req.tools), "tool_choice": req.tool_choice,
                            "parallel_tool_calls": req.parallel_tool_calls,
                            "response_format": _response_format(req.text),
                            "chat_template_kwargs": req.chat_template_kwargs}
    if isinstance(req.tool_choice, dict):  # Responses names the function at the top level of tool_choice
        body["tool_choice"] = {"type": "function", "function": {"name": req.tool_choice.get("name")}}
    for name in ("temperature", "top_p"):
        if getattr(req, name) is not None:
            body[name] = getattr(req, name)
    body.update({k: v for k, v in (req.model_extra or {}).items() if k in CHAT_EXTRAS})
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as e:
        raise RequestValidationError(e.errors()) from None


def _new(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class _Output:
    """The response's output items as they form, and the Responses events that announce them."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.seq = 0
        self.open: dict[str, Any] | None = None

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        return {"type": kind, "sequence_number": self.seq - 1, **fields}

    def _start(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        events = self.close()
        self.items.append(item)
        self.open = item
        index = len(self.items) - 1
        events.append(self.event("response.output_item.added", output_index=index,
                                 item={**item, "content": []} if "content" in item else dict(item)))
        if item["type"] == "message":
            events.append(self.event("response.content_part.added", item_id=item["id"], output_index=index,
                                     content_index=0, part={"type": "output_text", "text": "", "annotations": []}))
        elif item["type"] == "reasoning":
            events.append(self.event("response.content_part.added", item_id=item["id"], output_index=index,
                                     content_index=0, part={"type": "reasoning_text", "text": ""}))
        return events

    def add(self, delta: dict[str, Any]) -> list[dict[str, Any]]:
        """Events for one chat delta (reasoning_content, content, tool_calls)."""
        events: list[dict[str, Any]] = []
        index = lambda: len(self.items) - 1  # noqa: E731
        if delta.get("reasoning_content"):
            if self.open is None or self.open["type"] != "reasoning":
                events += self._start(_reasoning_item(""))
            self.open["content"][0]["text"] += delta["reasoning_content"]
            events.append(self.event("response.reasoning_text.delta", item_id=self.open["id"],
                                     output_index=index(), content_index=0, delta=delta["reasoning_content"]))
        if delta.get("content"):
            if self.open is None or self.open["type"] != "message":
                events += self._start(_message_item(""))
            self.open["content"][0]["text"] += delta["content"]
            events.append(self.event("response.output_text.delta", item_id=self.open["id"], output_index=index(),
                                     content_index=0, delta=delta["content"], logprobs=[]))
        for call in delta.get("tool_calls") or []:
            fn = call.get("function") or {}
            if call.get("id") is not None:
                events += self._start(_call_item(call["id"], fn.get("name", ""), ""))
            args = fn.get("arguments") or ""
            if args and self.open is not None and self.open["type"] == "function_call":
                self.open["arguments"] += args
                events.append(self.event("response.function_call_arguments.delta", item_id=self.open["id"],
                                         output_index=index(), delta=args))
        return events

    def close(self) -> list[dict[str, Any]]:
        item, self.open = self.open, None
        if item is None:
            return []
        index = len(self.items) - 1
        item["status"] = "completed"
        events = []
        if item["type"] in ("message", "reasoning"):
            part = item["content"][0]
            kind = "output_text" if item["type"] == "message" else "reasoning_text"
            extra = {"logprobs": []} if kind == "output_text" else {}
            events.append(self.event(f"response.{kind}.done", item_id=item["id"], output_index=index,
                                     content_index=0, text=part["text"], **extra))
            events.append(self.event("response.content_part.done", item_id=item["id"], output_index=index,
                                     content_index=0, part=part))
        else:
            events.append(self.event("response.function_call_arguments.done", item_id=item["id"],
                                     output_index=index, arguments=item["arguments"], name=item["name"]))
        events.append(self.event("response.output_item.done", output_index=index, item=item))
        return events


def _message_item(text: str) -> dict[str, Any]:
    return {"type": "message", "id": _new("msg"), "status": "in_progress", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _reasoning_item(text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": _new("rs"), "status": "in_progress", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def _call_item(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"type": "function_call", "id": _new("fc"), "call_id": call_id, "name": name, "arguments": arguments,
            "status": "in_progress"}


def _output_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The output items as the chat messages a follow-up request's conversation holds."""
    out: list[dict[str, Any]] = []
    for item in items:
        if item["type"] == "message":
            out.append({"role": "assistant", "content": item["content"][0]["text"]})
        elif item["type"] == "function_call":
            out += input_messages([{"type": "function_call", "call_id": item["call_id"], "name": item["name"],
                                    "arguments": item["arguments"]}])
    merged: list[dict[str, Any]] = []
    for m in out:  # one assistant turn: its text and its calls together
        if merged and merged[-1]["role"] == "assistant" and m["role"] == "assistant":
            prev = merged[-1]
            prev["tool_calls"] = (prev.get("tool_calls") or []) + (m.get("tool_calls") or [])
            prev["content"] = prev.get("content") or m.get("content")
        else:
            merged.append(dict(m))
    return merged


class ResponsesAPI:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx
        self.store = ResponseStore()

    async def create(self, req: ResponsesRequest, raw: Request):
        history = self.store.get(req.previous_response_id)[1] if req.previous_response_id else []
        conversation = history + input_messages(req.input)
        system = [{"role": "system", "content": req.instructions}] if req.instructions else []
        chat = _chat_request(req, system + conversation)
        response_id = _new("resp")
        run = await start_chat(self.ctx, chat, "resp")
        head = {"id": response_id, "object": "response", "created_at": int(time.time()), "model": self.ctx.model_name,
                "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
                "previous_response_id": req.previous_response_id, "parallel_tool_calls": req.parallel_tool_calls,
                "temperature": req.temperature, "top_p": req.top_p, "tool_choice": req.tool_choice or "auto",
                "tools": req.tools or [], "text": req.text or {"format": {"type": "text"}}, "store": req.store,
                "metadata": req.metadata or {}, "error": None, "incomplete_details": None, "output": [],
                "status": "in_progress", "usage": None}

        def finish(output: list[dict[str, Any]], reason: str | None, n_out: int, cached: int) -> dict[str, Any]:
            body = {**head, "output": output, "status": "completed"}
            if reason == "length":
                body["status"], body["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
            # NOTE: the thinking re-encoded (the engine counts tokens, not which part they fell in)
            thought = "".join(i["content"][0]["text"] for i in output if i["type"] == "reasoning")
            reasoning_tokens = len(self.ctx.tokenizer.encode(thought, add_special_tokens=False)) if thought else 0
            body["usage"] = {"input_tokens": len(run.prompt_ids), "input_tokens_details": {"cached_tokens": cached},
                             "output_tokens": n_out, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                             "total_tokens": len(run.prompt_ids) + n_out}
            if req.store:
                self.store.put(response_id, body, conversation + _output_messages(output))
            return body

        if req.stream:
            return StreamingResponse(self._events(run, raw, head, finish), media_type="text/event-stream")
        text, n_out, reason, cached = "", 0, None, 0
        async with Guarded(raw, run.stream) as outputs:
            async for out in outputs:
                text += out.new_text
                n_out += len(out.new_token_ids)
                cached = max(cached, out.num_cached_tokens)
                if out.finished:
                    reason = out.finish_reason
        if run.stream.aborted:
            return JSONResponse({}, status_code=499)
        message, reason = run.final_message(text, reason)
        items = []
        if message.get("reasoning_content"):
            items.append({**_reasoning_item(message["reasoning_content"]), "status": "completed"})
        if message.get("content"):
            items.append({**_message_item(message["content"]), "status": "completed"})
        for call in message.get("tool_calls") or []:
            items.append({**_call_item(call["id"], call["function"]["name"], call["function"]["arguments"]),
                          "status": "completed"})
        return JSONResponse(finish(items, reason, n_out, cached))

    async def _events(self, run: ChatRun, raw: Request, head: dict[str, Any],
                      finish: Callable[[list[dict[str, Any]], str | None, int, int], dict[str, Any]]
                      ) -> AsyncIterator[str]:
        out_items = _Output()
        yield _sse(out_items.event("response.created", response=head))
        yield _sse(out_items.event("response.in_progress", response=head))
        cs = run.choice_stream()
        n_out, reason, cached = 0, None, 0
        try:
            async with Guarded(raw, run.stream) as outputs:
                async for out in outputs:
                    n_out += len(out.new_token_ids)
                    cached = max(cached, out.num_cached_tokens)
                    for event in out_items.add(cs.delta(out.new_text, out.finished)):
                        yield _sse(event)
                    if out.finished:
                        reason = cs.finish_reason(out.finish_reason)
        except (APIError, EngineDeadError) as e:
            message = e.message if isinstance(e, APIError) else str(e)
            yield _sse(out_items.event("error", code="server_error", message=message, param=None))
            return
        if run.stream.aborted:
            return
        for event in out_items.close():
            yield _sse(event)
        body = finish(out_items.items, reason, n_out, cached)
        kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        yield _sse(out_items.event(kind, response=body))


def _sse(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False, separators=(',', ':'))}\n\n"


def register(app: FastAPI, ctx: ServingContext, parse_body: Callable[[Request, type], Awaitable[Any]]) -> None:
    api = ResponsesAPI(ctx)

    @app.post("/v1/responses")
    async def responses(raw: Request):
        return await api.create(await parse_body(raw, ResponsesRequest), raw)

    @app.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str) -> dict:
        return api.store.get(response_id, None)[0]

    @app.delete("/v1/responses/{response_id}")
    async def delete(response_id: str) -> dict:
        api.store.delete(response_id)
        return {"id": response_id, "object": "response", "deleted": True}
