"""The ASGI guard in front of every route: API key (and its limits), then body size.

Pure ASGI middleware, so streaming and disconnects pass through untouched. Route classes:
open (/health, /version, /metrics, the web page), keyed (/v1, /tokenize, /detokenize, /status, Ollama's /api: any
valid key; Anthropic's clients send it as x-api-key) and admin (/models, /keys, loading and unloading LoRA adapters:
the admin key only). The key is
named for the route (api_keys.current_key): which models it may use and see is model_access's one check, where a
route reaches a model. POSTs that name a model (under /v1/, /api/chat, /api/generate, /api/embed, /api/show,
/tokenize, /detokenize: any of them may load one) are the requests a key's limits count.
"""
from __future__ import annotations

import json
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hearth.entrypoints.openai.api_keys import KeyRing, KeySpec, LimitExceeded, Meter, current_key, current_meter
from hearth.entrypoints.openai.errors import error_body, shaped_for

_KEYED = ("/v1/", "/tokenize", "/detokenize", "/status", "/api/", "/lora-adapters")  # /api/: Ollama's API
# POSTs here are what a key's limits count: each names a model, which it may load (under a router) and run
_COUNTED = ("/v1/", "/api/chat", "/api/generate", "/api/embed", "/api/show", "/tokenize", "/detokenize")
_ADMIN = ("/models", "/keys", "/v1/load_lora_adapter", "/v1/unload_lora_adapter")


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
        if not (scope["method"] == "POST" and path.startswith(_COUNTED)):
            return await self._sized(headers, scope, receive, send)
        if self._too_large(headers):
            return await self._reply_too_large(send, scope["path"])
        receive = self._counted(receive)
        try:
            usage = self.keys.admit(spec)
        except LimitExceeded as e:
            return await _reply(send, path, 429, error_body(str(e), "rate_limit_error", None, "rate_limit_exceeded"),
                                [(b"retry-after", str(e.retry_after).encode())])
        token = current_meter.set(Meter(self.keys, spec.name, usage, spec.tokens_per_day))
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


async def _reply(send: Send, path: str, status: int, body: dict,
                 extra: list[tuple[bytes, bytes]] | None = None) -> None:
    """Answer a refusal in the shape the route's clients read (errors.shaped_for)."""
    data = json.dumps(shaped_for(path, status, body)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *(extra or [])]})
    await send({"type": "http.response.body", "body": data})

