"""The ASGI guard in front of every route: API key (and its limits and models), then body size.

Pure ASGI middleware, so streaming and disconnects pass through untouched. Route classes:
open (/health, /version, /metrics, the web page), keyed (/v1, /tokenize, /detokenize, /status, Ollama's /api: any
valid key; Anthropic's clients send it as x-api-key) and admin (/models, /keys: the admin key only). Generating
requests (POST under /v1/, /api/chat, /api/generate) are the ones a key's limits count.
"""
from __future__ import annotations

import json
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hearth.entrypoints.openai.body import JSONTextError, parse_json
from hearth.entrypoints.openai.api_keys import KeyRing, KeySpec, LimitExceeded, Meter, current_key, current_meter
from hearth.entrypoints.openai.errors import error_body, shaped_for

_KEYED = ("/v1/", "/tokenize", "/detokenize", "/status", "/api/")  # /api/: Ollama's API
# POSTs here are what a key's limits count (/api/embed, like /v1/embeddings, runs the model)
_GENERATING = ("/v1/", "/api/chat", "/api/generate", "/api/embed")
_ADMIN = ("/models", "/keys")


def _is_admin_path(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in _ADMIN)


class BodyTooLarge(StarletteHTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than the limit of {limit} bytes")


class Guard:
    def __init__(self, app: ASGIApp, keys: KeyRing | None, max_body_bytes: int) -> None:
        self.app = app
        self.keys = keys
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        path = scope["path"]
        admin = _is_admin_path(path)
        if self.keys is None or not (admin or path.startswith(_KEYED)):
            return await self._sized(headers, scope, receive, send)
        given = headers.get(b"authorization", b"")
        if not given and b"x-api-key" in headers:  # Anthropic's clients send the key there
            given = b"Bearer " + headers[b"x-api-key"]
        spec = self.keys.lookup(given)
        if spec is None:
            return await _reply(send, path, 401, error_body("invalid or missing API key: send "
                                                            "'Authorization: Bearer <key>'", "invalid_request_error",
                                                            None, "invalid_api_key"))
        if admin and not spec.admin:
            return await _reply(send, path, 403, error_body(
                f"{path} needs the admin key; key {spec.name!r} is not it", "permission_error", None,
                "admin_key_required"))
        token = current_key.set(spec)
        try:
            await self._as_key(spec, headers, scope, receive, send)
        finally:
            current_key.reset(token)

    async def _as_key(self, spec: KeySpec, headers: dict[bytes, bytes], scope: Scope, receive: Receive,
                      send: Send) -> None:
        path = scope["path"]
        if scope["method"] == "GET" and path == "/v1/models" and spec.models is not None:
            return await self.app(scope, receive, _only_models(send, spec.models))
        if not (scope["method"] == "POST" and path.startswith(_GENERATING)):
            return await self._sized(headers, scope, receive, send)
        if self._too_large(headers):
            return await self._reply_too_large(send, scope["path"])
        receive = self._counted(receive)
        if spec.models is not None:
            try:
                receive, refusal = await self._check_model(spec, receive, path.startswith("/api/"))
            except BodyTooLarge:  # raised here, outside the app's handlers, so answered here
                return await self._reply_too_large(send, scope["path"])
            if refusal is not None:
                return await _reply(send, path, 403, refusal)
        try:
            usage = self.keys.admit(spec)
        except LimitExceeded as e:
            return await _reply(send, path, 429, error_body(str(e), "rate_limit_error", None, "rate_limit_exceeded"),
                                [(b"retry-after", str(e.retry_after).encode())])
        token = current_meter.set(Meter(self.keys, spec.name, usage))
        try:
            await self.app(scope, receive, send)
        finally:
            current_meter.reset(token)
            self.keys.release(usage)

    def _too_large(self, headers: dict[bytes, bytes]) -> bool:
        length = headers.get(b"content-length")
        return length is not None and length.isdigit() and int(length) > self.max_body_bytes

    async def _reply_too_large(self, send: Send, path: str) -> None:
        await _reply(send, path, 413, error_body(f"the request body is larger than the limit of "
                                                 f"{self.max_body_bytes} bytes", "invalid_request_error", None,
                                                 "request_too_large"))

    async def _sized(self, headers: dict[bytes, bytes], scope: Scope, receive: Receive, send: Send) -> None:
        if self._too_large(headers):
            return await self._reply_too_large(send, scope["path"])
        await self.app(scope, self._counted(receive), send)

    def _counted(self, receive: Receive) -> Receive:
        seen = 0

        async def counted() -> Message:  # chunked bodies carry no content-length: count as they arrive
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    raise BodyTooLarge(self.max_body_bytes)
            return message

        return counted

    async def _check_model(self, spec: KeySpec, receive: Receive, ollama: bool) -> tuple[Receive, dict | None]:
        """Read the whole body to see its `model`; hand the app a receive that replays it. Unparsable bodies go
        on to the app, which answers them with its 400."""
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        try:
            obj = parse_json(body)
        except JSONTextError:  # (too deep included: the app's parse_body answers it in the route's shape)
            return replay, None
        model = obj.get("model") if isinstance(obj, dict) else None
        allowed = sorted(spec.models or ())
        if model is None:
            return replay, error_body(f"key {spec.name!r} may use only the models {allowed}: name one in 'model'",
                                      "permission_error", "model", "model_not_allowed")
        if ollama and isinstance(model, str) and model not in allowed:
            model = model.removesuffix(":latest")  # Ollama's clients' name for the same model
        if model not in allowed:
            return replay, error_body(f"key {spec.name!r} may not use the model {model!r}; it may use {allowed}",
                                      "permission_error", "model", "model_not_allowed")
        return replay, None


def _only_models(send: Send, allowed: frozenset[str]) -> Send:
    """GET /v1/models for a key with a model list: only its models (so the page's picker offers no 403s)."""
    start: Message | None = None
    chunks: list[bytes] = []

    async def filtered(message: Message) -> None:
        nonlocal start
        if message["type"] == "http.response.start":
            start = message
            return
        chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        body = b"".join(chunks)
        if start is not None and start["status"] == 200:
            obj = json.loads(body)
            obj["data"] = [m for m in obj.get("data", []) if m.get("id") in allowed]
            body = json.dumps(obj).encode()
        kept = [(k, v) for k, v in (start or {}).get("headers", []) if k.lower() != b"content-length"]
        await send({**(start or {"type": "http.response.start", "status": 500}),
                    "headers": [*kept, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return filtered


async def _reply(send: Send, path: str, status: int, body: dict,
                 extra: list[tuple[bytes, bytes]] | None = None) -> None:
    """Answer a refusal in the shape the route's clients read (errors.shaped_for)."""
    data = json.dumps(shaped_for(path, status, body)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *(extra or [])]})
    await send({"type": "http.response.body", "body": data})

