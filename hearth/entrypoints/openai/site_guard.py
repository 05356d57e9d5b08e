"""The outer ASGI guard, in front of every route (and of the API-key guard): Host allow-list (DNS rebinding),
Origin check (cross-site requests), and a body read timeout (slow clients). Pure ASGI, so streaming and
disconnects pass through untouched.
"""
from __future__ import annotations

import asyncio
import ipaddress
import json
from dataclasses import dataclass, field

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hearth.entrypoints.openai.errors import error_body, shaped_for

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


@dataclass
class SiteConfig:
    allowed_hosts: list[str] | None = None  # None or ["*"]: any Host header
    allowed_origins: list[str] = field(default_factory=list)  # ["*"]: any; [] refuses cross-origin requests
    body_timeout: float = 30.0  # seconds between two body chunks


def default_allowed_hosts(bind_host: str) -> list[str] | None:
    """The bind address, plus localhost and 127.0.0.1 when bound to loopback. A wildcard bind (0.0.0.0, ::) is
    reached under names the server cannot know: any Host is then answered unless --allowed-hosts says otherwise."""
    if bind_host in ("", "0.0.0.0", "::"):
        return None
    hosts = [bind_host]
    try:
        loopback = bind_host == "localhost" or ipaddress.ip_address(bind_host).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        hosts += [h for h in LOOPBACK_NAMES if h != bind_host]
    return hosts


def _host_name(host: str) -> str:
    """A Host header without its port: 'a:80' -> 'a', '[::1]:80' -> '::1'."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class BodyTimeout(StarletteHTTPException):
    def __init__(self, seconds: float) -> None:
        super().__init__(408, f"the request body did not arrive: nothing received for {seconds:g} s")


class SiteGuard:
    def __init__(self, app: ASGIApp, config: SiteConfig) -> None:
        self.app = app
        self.config = config
        hosts = config.allowed_hosts
        self.hosts = None if hosts is None or "*" in hosts else {_host_name(h) for h in hosts}
        self.any_origin = "*" in config.allowed_origins
        self.origins = {o.rstrip("/").lower() for o in config.allowed_origins}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        host = headers.get(b"host", b"").decode("latin-1")
        if self.hosts is not None and _host_name(host) not in self.hosts:
            return await reply(send, 400, shaped_for(scope["path"], 400, error_body(
                f"the Host header {host[:100]!r} is not one this server answers to: add it with --allowed-hosts",
                param="host", code="host_not_allowed")))
        origin = headers.get(b"origin")
        if origin is not None and not self._origin_ok(origin.decode("latin-1"), host):
            return await reply(send, 403, shaped_for(scope["path"], 403, error_body(
                f"cross-origin requests from {origin.decode('latin-1')[:100]!r} are refused: allow the origin with "
                "--allowed-origins", param="origin", code="origin_not_allowed")))
        done = False
        timeout = self.config.body_timeout

        async def timed() -> Message:
            # A client that stops sending mid-body gets 408 instead of holding the request open.
            nonlocal done
            if done:  # the body is complete: what remains is the wait for a disconnect
                return await receive()
            try:
                async with asyncio.timeout(timeout):
                    message = await receive()
            except TimeoutError:
                raise BodyTimeout(timeout) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                done = True
            return message

        await self.app(scope, timed, send)

    def _origin_ok(self, origin: str, host: str) -> bool:
        origin = origin.rstrip("/").lower()
        if self.any_origin or origin in self.origins:
            return True
        # Same origin (a page this server served): the Origin's host:port is the Host header.
        scheme, _, netloc = origin.partition("://")
        return scheme in ("http", "https") and netloc == host.strip().lower()


async def reply(send: Send, status: int, body: dict) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
