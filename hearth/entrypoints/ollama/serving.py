"""Ollama's routes: /api/chat and /api/generate (NDJSON streams) over hearth's chat and completion paths, the model
listings (/api/tags, /api/ps, /api/show), /api/version, and clear errors for what hearth does not do (/api/pull).
Errors are Ollama's shape: {"error": "..."}."""
from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from hearth import __version__
from hearth.entrypoints.openai.body import JSONTextError, openapi_body, parse_json
from hearth.entrypoints.openai.chat_drive import Tally, drive, run_whole
from hearth.engine.async_engine import RequestStream
from hearth.engine.protocol import EngineRequest
from hearth.entrypoints.ollama import embed
from hearth.entrypoints.ollama.model_info import ModelInfo, ollama_name
from hearth.entrypoints.ollama.protocol import (
    ChatRequest,
    GenerateRequest,
    ShowRequest,
    sampling_fields,
    think_kwargs,
)
from hearth.entrypoints.openai.errors import APIError, validation_message, bad_request
from hearth.entrypoints.openai.fim import fim_prompt_ids
from hearth.errors import ParamError
from hearth.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from hearth.entrypoints.openai.serving_chat import ChoiceStream, start_chat
from hearth.entrypoints.openai.served_models import ServedModels
from hearth.entrypoints.openai.serving_common import SAMPLING_PARAMS, ServingContext, new_id

OLLAMA_API_VERSION = "0.9.0"  # the Ollama release whose API this follows (clients gate features on it)
NOT_HERE = ("hearth serves the models it was started with and never downloads or stores models: start "
            "`hearth serve <model.gguf or HF folder>` (or `--models-dir DIR`) with the models you want (see "
            "`hearth serve --help`)")


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _validated(model: type, body: dict[str, Any]) -> Any:
    try:
        return model.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as e:
        raise RequestValidationError(e.errors()) from None


def _timings(t0: float, t_first: float | None, n_prompt: int, n_out: int) -> dict[str, Any]:
    end = time.monotonic()
    first = t_first if t_first is not None else end
    ns = lambda s: int(s * 1e9)  # noqa: E731
    return {"total_duration": ns(end - t0), "load_duration": 0, "prompt_eval_count": n_prompt,
            "prompt_eval_duration": ns(first - t0), "eval_count": n_out, "eval_duration": ns(end - first)}


def _tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for c in calls:
        fn = c.get("function") or {}
        try:
            args = parse_json(fn.get("arguments") or "{}")
        except JSONTextError:
            args = {}
        out.append({"function": {"name": fn.get("name"), "arguments": args}})
    return out


def _with_images(content: str | None, images: list[str] | None) -> str | list[dict[str, Any]] | None:
    """Ollama's base64 `images` as OpenAI image_url parts before the text (the chat route decodes and checks
    them: a bad one, or any for a text-only model, is a 400 naming it)."""
    if not images:
        return content
    # (the format is read from the bytes; the media type here is only the data URL's form)
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": f"data:image/*;base64,{b64}"}}
                                   for b64 in images]
    return parts + [{"type": "text", "text": content or ""}]


def _chat_messages(messages: list[Any]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        msg: dict[str, Any] = {"role": m.role, "content": _with_images(m.content, m.images)}
        if m.tool_calls:
            msg["tool_calls"] = [{"id": f"call_{i}", "type": "function",
                                  "function": {"name": (c.get("function") or {}).get("name"),
                                               "arguments": (c.get("function") or {}).get("arguments") or {}}}
                                 for i, c in enumerate(m.tool_calls)]
        if m.role == "tool" and m.tool_name:
            msg["name"] = m.tool_name
        out.append(msg)
    return out


class OllamaAPI:
    def __init__(self, models: ServedModels) -> None:
        self.models = models
        self._infos: dict[tuple[str, str], ModelInfo] = {}

    def info(self, name: str, path: str) -> ModelInfo:
        key = (name, path)
        if key not in self._infos:
            self._infos[key] = ModelInfo(name, path)
        return self._infos[key]

    async def context(self, name: str | None) -> ServingContext:
        """The model a request names, as Ollama's clients name it ("name" or "name:latest"; none: the first)."""
        if not name:
            return await self.models.context(None)
        try:
            return await self.models.context(name)
        except APIError as e:
            if e.status != 404:
                raise
        if name.endswith(":latest"):
            try:
                return await self.models.context(name.removesuffix(":latest"))
            except APIError as e:
                if e.status != 404:
                    raise
        served = ", ".join(f"'{ollama_name(m.name)}'" for m in self.models.listings())
        raise APIError(404, f"model '{name}' not found; this server serves {served}")

    def _chat_request(self, messages: list[dict[str, Any]], req: ChatRequest | GenerateRequest,
                      tools: list[dict[str, Any]] | None = None) -> ChatCompletionRequest:
        body = {"messages": messages, **sampling_fields(req.options, req.format), "tools": tools,
                "chat_template_kwargs": think_kwargs(req.think)}
        return _validated(ChatCompletionRequest, body)

    async def chat(self, req: ChatRequest, raw: Request):
        ctx = await self.context(req.model)
        if not req.messages:  # Ollama's way to load a model: nothing to generate
            return {"model": req.model, "created_at": _now(), "message": {"role": "assistant", "content": ""},
                    "done_reason": "load", "done": True}
        chat = self._chat_request(_chat_messages(req.messages), req, req.tools)
        t0 = time.monotonic()
        run = await start_chat(ctx, chat, "ollama")

        def message(delta: dict[str, Any]) -> dict[str, Any]:
            m: dict[str, Any] = {"role": "assistant", "content": delta.get("content") or ""}
            if delta.get("reasoning_content"):
                m["thinking"] = delta["reasoning_content"]
            if delta.get("tool_calls"):
                m["tool_calls"] = _tool_calls(delta["tool_calls"])
            return m

        return await self._respond(req, raw, run.stream, len(run.prompt_ids), t0, run.choice_stream(),
                                   lambda text, reason: run.final_message(text, reason),
                                   lambda delta: {"message": message(delta)})

    async def generate(self, req: GenerateRequest, raw: Request):
        ctx = await self.context(req.model)
        if not req.prompt and req.suffix is None:
            return {"model": req.model, "created_at": _now(), "response": "", "done_reason": "load", "done": True}
        t0 = time.monotonic()
        if req.images and (req.raw or req.suffix is not None):
            raise APIError(400, "images need the chat template: drop raw (and suffix) to send images")
        if req.template:
            raise APIError(400, "template is not supported: hearth renders the model's chat template (pass raw "
                                "true with a prompt you formatted yourself)")
        if not req.raw and req.suffix is None:  # the chat template formats the prompt
            messages = ([{"role": "system", "content": req.system}] if req.system else []) + [
                {"role": "user", "content": _with_images(req.prompt, req.images)}]
            run = await start_chat(ctx, self._chat_request(messages, req), "ollama")
            stream, ids, cs = run.stream, run.prompt_ids, run.choice_stream()
            final = lambda text, reason: run.final_message(text, reason)  # noqa: E731
        else:
            ids = (req.context or []) + (fim_prompt_ids(ctx.fim, ctx.tokenizer, req.prompt, req.suffix)
                                         if req.suffix is not None else ctx.tokenizer.encode(req.prompt))
            stream = await self._submit_raw(ctx, ids, req)
            cs, final = None, lambda text, reason: ({"content": text}, reason)

        def response(delta: dict[str, Any]) -> dict[str, Any]:
            out: dict[str, Any] = {"response": delta.get("content") or ""}
            if delta.get("reasoning_content"):
                out["thinking"] = delta["reasoning_content"]
            return out

        return await self._respond(req, raw, stream, len(ids), t0, cs, final, response, generate_ids=ids)

    async def _submit_raw(self, ctx: ServingContext, ids: list[int], req: GenerateRequest) -> RequestStream:
        creq = _validated(CompletionRequest, {"prompt": ids, **sampling_fields(req.options, req.format),
                                              "max_tokens": (req.options or {}).get("num_predict")})
        if creq.max_tokens is not None and creq.max_tokens < 0:
            creq.max_tokens = None
        try:
            spec, param = creq.structured_params()
            params = creq.sampling_params(creq.max_tokens, None, structured_outputs=spec)
        except ParamError as e:
            raise APIError(400, str(e), param=e.param) from None
        except ValueError as e:
            raise bad_request(e, SAMPLING_PARAMS) from None
        await ctx.compile_structured(spec, "format" if param else None)
        return await ctx.generate([EngineRequest(new_id("ollama"), ids, params)])

    async def _respond(self, req: ChatRequest | GenerateRequest, raw: Request, stream: RequestStream, n_prompt: int,
                       t0: float, cs: ChoiceStream | None,
                       final: Callable[[str, str | None], tuple[dict[str, Any], str | None]],
                       shape: Callable[[dict[str, Any]], dict[str, Any]], generate_ids: list[int] | None = None):
        """One NDJSON line per engine output (or one object when stream is false), then the done line."""
        head = {"model": req.model}
        t = Tally(keep_ids=generate_ids is not None)

        def done_line() -> dict[str, Any]:
            line = {**head, "created_at": _now(), "done": True,
                    "done_reason": "length" if t.reason == "length" else "stop",
                    **_timings(t0, t.first_at, n_prompt, t.n_out)}
            if generate_ids is not None:
                line["context"] = generate_ids + t.out_ids
            return line

        if req.stream:
            async def lines() -> AsyncIterator[str]:
                try:
                    async with aclosing(drive(stream, raw, t, cs)) as outputs:
                        async for delta, _, _ in outputs:
                            if delta:
                                yield json.dumps({**head, "created_at": _now(), **shape(delta), "done": False}) + "\n"
                except APIError as e:
                    yield json.dumps({"error": e.message}) + "\n"
                    return
                if not t.aborted:
                    last = done_line()
                    last.update(shape({}))
                    yield json.dumps(last) + "\n"
            return StreamingResponse(lines(), media_type="application/x-ndjson")

        await run_whole(stream, raw, t)
        if t.aborted:
            return JSONResponse({}, status_code=499)
        message, _ = final(t.text, t.reason)
        return {**done_line(), **shape(message)}

    def tags(self) -> dict[str, Any]:
        return {"models": [self.info(m.name, m.path).entry(m.ctx) for m in self.models.listings()]}

    def ps(self) -> dict[str, Any]:
        """The loaded models (all of them with one model; a router's resident ones)."""
        return {"models": [{**self.info(m.name, m.path).entry(m.ctx), "expires_at": "2999-01-01T00:00:00Z",
                            "size_vram": 0, "context_length": m.ctx.max_model_len}
                           for m in self.models.listings() if m.ctx is not None]}

    async def show(self, req: ShowRequest) -> dict[str, Any]:
        ctx = await self.context(req.model or req.name)
        info = self.info(ctx.model_name, ctx.model_path)
        family = info.family(ctx)
        caps = ["completion"]
        if ctx.tokenizer.chat_template and "tools" in ctx.tokenizer.chat_template:
            caps.append("tools")
        if ctx.reasoning_parser is not None:
            caps.append("thinking")
        if ctx.fim is not None:
            caps.append("insert")
        return {"modelfile": "", "parameters": "", "template": ctx.tokenizer.chat_template or "",
                "details": info.details(ctx), "modified_at": info.modified_at, "capabilities": caps,
                "model_info": {"general.architecture": family, f"{family}.context_length": ctx.max_model_len}}


def register(app: FastAPI, models: ServedModels, parse_body: Callable[[Request, type], Awaitable[Any]]) -> None:
    api = OllamaAPI(models)

    async def ollama_shaped(call: Awaitable[Any]) -> Any:
        try:
            return await call
        except APIError as e:
            return _error(e.status, e.message)
        except RequestValidationError as e:
            return _error(400, validation_message(e)[0])

    @app.get("/api/version")
    async def version() -> dict:
        return {"version": OLLAMA_API_VERSION, "hearth_version": __version__}

    @app.get("/api/tags")
    async def tags() -> dict:
        return api.tags()

    @app.get("/api/ps")
    async def ps() -> dict:
        return api.ps()

    @app.post("/api/show", openapi_extra=openapi_body(ShowRequest))
    async def show(raw: Request):
        async def run() -> Any:
            return await api.show(await parse_body(raw, ShowRequest))
        return await ollama_shaped(run())

    @app.post("/api/chat", openapi_extra=openapi_body(ChatRequest))
    async def chat(raw: Request):
        async def run() -> Any:
            return await api.chat(await parse_body(raw, ChatRequest), raw)
        return await ollama_shaped(run())

    @app.post("/api/generate", openapi_extra=openapi_body(GenerateRequest))
    async def generate(raw: Request):
        async def run() -> Any:
            return await api.generate(await parse_body(raw, GenerateRequest), raw)
        return await ollama_shaped(run())

    embed.register(app, api.context, parse_body)  # POST /api/embed and the older /api/embeddings

    for path in ("/api/pull", "/api/push", "/api/create", "/api/copy", "/api/delete"):
        async def not_here() -> JSONResponse:
            return _error(400, NOT_HERE)
        app.add_api_route(path, not_here, methods=["POST", "DELETE"])
