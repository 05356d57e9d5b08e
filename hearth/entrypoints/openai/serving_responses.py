"""POST /v1/responses (OpenAI's Responses API) over the chat path: input items -> chat messages -> start_chat; the
answer as output items (reasoning, message, function_call), whole or as the Responses event stream. GET and
DELETE /v1/responses/{id} read and forget the in-memory store behind previous_response_id."""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from hearth.entrypoints.openai.api_keys import owner
from hearth.entrypoints.openai.body import openapi_body
from hearth.entrypoints.openai.chat_drive import Tally, drive, run_whole
from hearth.entrypoints.openai.errors import APIError
from hearth.entrypoints.openai.responses_events import (
    OutputItems,
    call_item,
    message_item,
    new_item_id,
    output_messages,
    reasoning_item,
    sse_event,
)
from hearth.entrypoints.openai.responses_protocol import ResponsesRequest, chat_request, input_messages
from hearth.entrypoints.openai.serving_chat import ChatRun, start_chat
from hearth.entrypoints.openai.served_models import ServedModels

STORE_SIZE = 1000  # responses kept for previous_response_id (oldest dropped first)


class ResponseStore:
    """The last STORE_SIZE stored responses (body, and the conversation up to and with it) in memory, each kept for
    the key that made it: another key's id is answered as OpenAI answers an unknown one (404), so ids cannot be
    probed either."""

    def __init__(self, size: int = STORE_SIZE) -> None:
        self.size = size
        self.items: OrderedDict[tuple[str | None, str], tuple[dict[str, Any], list[dict[str, Any]]]] = OrderedDict()

    def get(self, response_id: str, param: str | None = "previous_response_id") -> tuple[dict, list[dict]]:
        found = self.items.get((owner(), response_id))
        if found is None:
            raise APIError(404, f"no stored response has the id {response_id!r} (responses made with store false, "
                                f"and all but the last {self.size}, are not kept)", param=param,
                           code="response_not_found")
        return found

    def put(self, response_id: str, body: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        self.items[(owner(), response_id)] = (body, messages)
        while len(self.items) > self.size:
            self.items.popitem(last=False)

    def delete(self, response_id: str) -> None:
        self.get(response_id, None)
        del self.items[(owner(), response_id)]


class ResponsesAPI:
    def __init__(self, models: ServedModels) -> None:
        self.models = models
        self.store = ResponseStore()  # NOTE: one for every model: a conversation may go on with another model

    async def create(self, req: ResponsesRequest, raw: Request):
        ctx = await self.models.context(req.model)
        history = self.store.get(req.previous_response_id)[1] if req.previous_response_id else []
        conversation = history + input_messages(req.input)
        system = [{"role": "system", "content": req.instructions}] if req.instructions else []
        chat = chat_request(req, system + conversation)
        response_id = new_item_id("resp")
        run = await start_chat(ctx, chat, "resp")
        head = {"id": response_id, "object": "response", "created_at": int(time.time()), "model": ctx.model_name,
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
            reasoning_tokens = len(ctx.tokenizer.encode(thought, add_special_tokens=False)) if thought else 0
            body["usage"] = {"input_tokens": len(run.prompt_ids), "input_tokens_details": {"cached_tokens": cached},
                             "output_tokens": n_out, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                             "total_tokens": len(run.prompt_ids) + n_out}
            if req.store:
                self.store.put(response_id, body, conversation + output_messages(output))
            return body

        if req.stream:
            return StreamingResponse(self._events(run, raw, head, finish), media_type="text/event-stream")
        t = await run_whole(run.stream, raw, Tally())
        if t.aborted:
            return JSONResponse({}, status_code=499)
        message, reason = run.final_message(t.text, t.reason)
        items = []
        if message.get("reasoning_content"):
            items.append({**reasoning_item(message["reasoning_content"]), "status": "completed"})
        if message.get("content"):
            items.append({**message_item(message["content"]), "status": "completed"})
        for call in message.get("tool_calls") or []:
            items.append({**call_item(call["id"], call["function"]["name"], call["function"]["arguments"]),
                          "status": "completed"})
        return JSONResponse(finish(items, reason, t.n_out, t.cached))

    async def _events(self, run: ChatRun, raw: Request, head: dict[str, Any],
                      finish: Callable[[list[dict[str, Any]], str | None, int, int], dict[str, Any]]
                      ) -> AsyncIterator[str]:
        out_items = OutputItems()
        yield sse_event(out_items.event("response.created", response=head))
        yield sse_event(out_items.event("response.in_progress", response=head))
        t, reason = Tally(), None
        try:
            async with aclosing(drive(run.stream, raw, t, run.choice_stream())) as outputs:
                async for delta, finished, finish_reason in outputs:
                    for event in out_items.add(delta):
                        yield sse_event(event)
                    if finished:
                        reason = finish_reason
        except APIError as e:
            yield sse_event(out_items.event("error", code="server_error", message=e.message, param=None))
            return
        if t.aborted:
            return
        for event in out_items.close():
            yield sse_event(event)
        body = finish(out_items.items, reason, t.n_out, t.cached)
        kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        yield sse_event(out_items.event(kind, response=body))

def register(app: FastAPI, models: ServedModels, parse_body: Callable[[Request, type], Awaitable[Any]]) -> None:
    api = ResponsesAPI(models)

    @app.post("/v1/responses", openapi_extra=openapi_body(ResponsesRequest))
    async def responses(raw: Request):
        return await api.create(await parse_body(raw, ResponsesRequest), raw)

    @app.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str) -> dict:
        return api.store.get(response_id, None)[0]

    @app.delete("/v1/responses/{response_id}")
    async def delete(response_id: str) -> dict:
        api.store.delete(response_id)
        return {"id": response_id, "object": "response", "deleted": True}
