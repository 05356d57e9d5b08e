"""Call an ASGI app in-process and hand its response back as a stream: a head dict, then body chunks.

A model replica runs hearth's own FastAPI app behind this, so validation, errors, streaming and metrics are exactly
those of `hearth serve`; the ingress deployment only relays what comes out.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from starlette.types import ASGIApp, Message

_DONE: Message = {"type": "hearth.done"}


async def call_asgi(app: ASGIApp, method: str, path: str, query: bytes, headers: list[tuple[bytes, bytes]],
                    body: bytes, extra_headers: list[tuple[bytes, bytes]] | None = None
                    ) -> AsyncIterator[dict[str, Any] | bytes]:
    """Yields {"status", "headers"} once, then the body's chunks. Closing the iterator early is a client
    disconnect for the app (its streams abort and free their KV blocks)."""
    out: asyncio.Queue[Message] = asyncio.Queue()
    gone = asyncio.Event()
    body_sent = False

    async def receive() -> Message:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        await out.put(message)

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query,
             "root_path": "", "headers": headers, "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0)}

    async def run() -> None:
        try:
            await app(scope, receive, send)
        finally:
            out.put_nowait(_DONE)

    task = asyncio.create_task(run())
    try:
        while True:
            message = await out.get()
            if message is _DONE:
                break
            if message["type"] == "http.response.start":
                yield {"status": message["status"], "headers": list(message.get("headers", [])) + (extra_headers or [])}
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield bytes(message["body"])
                if not message.get("more_body", False):
                    break
    finally:
        gone.set()
        try:
            await asyncio.wait_for(task, 5.0)
        except Exception:  # noqa: BLE001 (a timeout; or the app's own error, which was its response already)
            task.cancel()


async def with_side_items(items: AsyncGenerator[Any, None], side: asyncio.Queue) -> AsyncIterator[Any]:
    """items' items, and each item put on `side` as soon as it is put there (before items' next one). Closing this
    closes `items`, as a client that goes away."""
    nxt = asyncio.ensure_future(items.__anext__())
    try:
        while True:
            getter = asyncio.ensure_future(side.get())
            await asyncio.wait({nxt, getter}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                yield getter.result()
                continue
            getter.cancel()
            try:
                item = nxt.result()
            except StopAsyncIteration:
                break
            while not side.empty():  # (put there before the item was made)
                yield side.get_nowait()
            yield item
            nxt = asyncio.ensure_future(items.__anext__())
    finally:
        if not nxt.done():
            nxt.cancel()  # (items' own cleanup runs as the cancellation reaches it)
            try:
                await nxt
            except BaseException:  # noqa: BLE001 (the cancellation, or the error it ended with)
                pass
        await items.aclose()
        while not side.empty():
            side.get_nowait()
