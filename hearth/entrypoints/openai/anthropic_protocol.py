"""The Anthropic Messages API's request bodies, and their system, content blocks and tools as a chat request."""
from __future__ import annotations

import json
from typing import Any, Literal

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from hearth.entrypoints.openai.errors import APIError
from hearth.entrypoints.openai.protocol import ChatCompletionRequest
from hearth.entrypoints.openai.responses_protocol import CHAT_EXTRAS


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class AnthropicTool(_Model):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class AnthropicMessage(_Model):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class CountTokensRequest(_Model):
    model: str | None = None
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: StrictInt
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: StrictInt | None = None
    stream: StrictBool = False
    metadata: dict[str, Any] | None = None


def _text(blocks: str | list[dict[str, Any]], where: str) -> str:
    if isinstance(blocks, str):
        return blocks
    texts = []
    for b in blocks:
        if b.get("type") != "text" or not isinstance(b.get("text"), str):
            raise APIError(400, f"{where}: content blocks of type {b.get('type')!r} are not supported here",
                           param="messages")
        texts.append(b["text"])
    return "\n".join(texts)


def chat_messages(req: CountTokensRequest) -> list[dict[str, Any]]:
    """Anthropic's system + messages as chat messages: tool_use blocks become the assistant's tool_calls,
    tool_result blocks tool messages."""
    out: list[dict[str, Any]] = []
    if req.system:
        out.append({"role": "system", "content": _text(req.system, "system")})
    for m in req.messages:
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            continue
        texts: list[str] = []
        parts: list[dict[str, Any]] = []  # text and image parts in order, used when there is an image
        calls: list[dict[str, Any]] = []
        for b in m.content:
            kind = b.get("type")
            if kind == "text":
                texts.append(b.get("text") or "")
                parts.append({"type": "text", "text": texts[-1]})
            elif kind == "image" and m.role == "user":
                parts.append(_image_part(b))
            elif kind == "tool_use" and m.role == "assistant":
                calls.append({"id": b.get("id"), "type": "function",
                              "function": {"name": b.get("name"), "arguments": json.dumps(b.get("input") or {})}})
            elif kind == "tool_result" and m.role == "user":
                content = b.get("content")
                result = _text(content, "tool_result") if content is not None else ""
                out.append({"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": result})
            elif kind in ("thinking", "redacted_thinking"):
                continue  # earlier thinking is not fed back (chat templates drop it too)
            else:
                raise APIError(400, f"{m.role} content blocks of type {kind!r} are not supported",
                               param="messages")
        if len(parts) > len(texts):  # images: OpenAI-style parts, which the chat route decodes and checks
            out.append({"role": m.role, "content": parts})
        elif texts or calls:
            msg: dict[str, Any] = {"role": m.role, "content": "\n".join(texts) if texts else None}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    return out


def _image_part(block: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic image block (base64 or url source) as an OpenAI image_url part."""
    source = block.get("source") or {}
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        url = f"data:{source.get('media_type') or 'image/*'};base64,{source['data']}"
    elif source.get("type") == "url" and isinstance(source.get("url"), str):
        url = source["url"]
    else:
        raise APIError(400, f"image blocks take a base64 or url source, not {source.get('type')!r}",
                       param="messages")
    return {"type": "image_url", "image_url": {"url": url}}


def chat_request(req: CountTokensRequest) -> ChatCompletionRequest:
    body: dict[str, Any] = {"model": req.model, "messages": chat_messages(req)}
    if req.tools:
        body["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                           "parameters": t.input_schema}} for t in req.tools]
    choice = req.tool_choice or {}
    kind = choice.get("type")
    if kind is not None:
        body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(kind) or (
            {"type": "function", "function": {"name": choice.get("name")}} if kind == "tool" else kind)
    if choice.get("disable_parallel_tool_use"):
        body["parallel_tool_calls"] = False
    if req.thinking is not None:  # Qwen3-style templates take the switch as enable_thinking
        body["chat_template_kwargs"] = {"enable_thinking": req.thinking.get("type") != "disabled"}
    fmt = (req.output_config or {}).get("format")
    if fmt:  # structured output: {"type": "json_schema", "schema": {...}}, through the grammar path
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "output", "schema": fmt.get("schema")}}
    body.update({k: v for k, v in (req.model_extra or {}).items() if k in CHAT_EXTRAS and k not in ("stop",)})
    if isinstance(req, MessagesRequest):
        body["max_tokens"] = req.max_tokens
        for ours, theirs in (("stop", "stop_sequences"), ("temperature", "temperature"), ("top_p", "top_p"),
                             ("top_k", "top_k")):
            if getattr(req, theirs) is not None:
                body[ours] = getattr(req, theirs)
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as e:
        raise RequestValidationError(e.errors()) from None
