"""The Responses API's output items (message, reasoning, function_call) and the stream events announcing them."""
from __future__ import annotations

import json
import uuid
from typing import Any

from hearth.entrypoints.openai.responses_protocol import input_messages


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputItems:
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
                events += self._start(reasoning_item(""))
            self.open["content"][0]["text"] += delta["reasoning_content"]
            events.append(self.event("response.reasoning_text.delta", item_id=self.open["id"],
                                     output_index=index(), content_index=0, delta=delta["reasoning_content"]))
        if delta.get("content"):
            if self.open is None or self.open["type"] != "message":
                events += self._start(message_item(""))
            self.open["content"][0]["text"] += delta["content"]
            events.append(self.event("response.output_text.delta", item_id=self.open["id"], output_index=index(),
                                     content_index=0, delta=delta["content"], logprobs=[]))
        for call in delta.get("tool_calls") or []:
            fn = call.get("function") or {}
            if call.get("id") is not None:
                events += self._start(call_item(call["id"], fn.get("name", ""), ""))
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


def message_item(text: str) -> dict[str, Any]:
    return {"type": "message", "id": new_item_id("msg"), "status": "in_progress", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def reasoning_item(text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": new_item_id("rs"), "status": "in_progress", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def call_item(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"type": "function_call", "id": new_item_id("fc"), "call_id": call_id, "name": name, "arguments": arguments,
            "status": "in_progress"}


def output_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
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

def sse_event(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False, separators=(',', ':'))}\n\n"
