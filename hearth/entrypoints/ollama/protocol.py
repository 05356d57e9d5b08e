"""Ollama request bodies, and how their `options` and `format` map onto hearth's OpenAI-shaped fields."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

# Ollama's documented defaults for options a request leaves out (its Modelfile defaults), so a client written
# for Ollama samples as it expects.
DEFAULT_OPTIONS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}
# Ollama option -> hearth (OpenAI / vLLM) field. Options not here (num_ctx, num_thread, num_gpu, mirostat, ...)
# are about how Ollama runs a model and are ignored.
OPTION_FIELDS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "seed": "seed",
                 "stop": "stop", "repeat_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
                 "frequency_penalty": "frequency_penalty"}


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class OllamaMessage(_Model):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[str] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_name: str | None = None
    thinking: str | None = None


class _Generating(_Model):
    model: str
    format: Literal["json", ""] | dict[str, Any] | None = None
    options: dict[str, Any] | None = None
    stream: StrictBool = True  # NOTE: Ollama streams unless told not to
    keep_alive: str | int | float | None = None
    think: StrictBool | Literal["low", "medium", "high"] | None = None


class ChatRequest(_Generating):
    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None


class GenerateRequest(_Generating):
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    raw: StrictBool = False
    images: list[str] | None = None
    context: list[int] | None = None


class ShowRequest(_Model):
    model: str | None = None
    name: str | None = None  # the older spelling


def sampling_fields(options: dict[str, Any] | None, fmt: str | dict[str, Any] | None) -> dict[str, Any]:
    """The OpenAI-shaped fields of an Ollama request's options and format."""
    opts = {**DEFAULT_OPTIONS, **(options or {})}
    out = {OPTION_FIELDS[k]: v for k, v in opts.items() if k in OPTION_FIELDS and v is not None}
    n = opts.get("num_predict")
    if n is not None and n >= 0:  # -1: until the model stops, -2: until the context is full
        out["max_tokens"] = n
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    return out


def think_kwargs(think: bool | str | None) -> dict[str, Any] | None:
    """Ollama's think switch as the chat template variable Qwen3-style templates read."""
    if think is None:
        return None
    return {"enable_thinking": think is not False}
