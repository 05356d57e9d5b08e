"""The Responses API's request body, and its input items, tools and text format as a chat request."""
from __future__ import annotations

import json
from typing import Any, Literal

from fastapi.exceptions import RequestValidationError
from pydantic import StrictBool, StrictInt, ValidationError

from hearth.entrypoints.openai.errors import APIError
from hearth.entrypoints.openai.protocol import ChatCompletionRequest, OpenAIModel

# vLLM's extra chat fields a Responses or Messages request may carry; the chat path checks their types.
CHAT_EXTRAS = ("top_k", "min_p", "seed", "stop", "stop_token_ids", "repetition_penalty", "presence_penalty",
               "frequency_penalty", "ignore_eos", "min_tokens", "chat_template", "structured_outputs")

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


def _text_of(content: str | list[dict[str, Any]] | None) -> str | list[dict[str, Any]]:
    """A message's content as text; with input_image parts, as OpenAI chat parts (the chat route decodes and
    checks the images)."""
    if content is None or isinstance(content, str):
        return content or ""
    texts, parts = [], []
    for part in content:
        if part.get("type") == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise APIError(400, "input_image parts take an image_url (a data URL); file_id is not supported",
                               param="input")
            parts.append({"type": "image_url", "image_url": {"url": url}})
            continue
        if part.get("type") not in ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
            raise APIError(400, f"input content parts of type {part.get('type')!r} are not supported", param="input")
        texts.append(part["text"])
        parts.append({"type": "text", "text": part["text"]})
    return parts if len(parts) > len(texts) else "\n".join(texts)


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

def chat_request(req: ResponsesRequest, messages: list[dict[str, Any]]) -> ChatCompletionRequest:
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
