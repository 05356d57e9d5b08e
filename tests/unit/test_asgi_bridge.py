"""hearth.ray.asgi_bridge: a replica's answer as a stream, with side items (a quota hold) sent the moment they
are made, before the answer's next item (the ingress waits for the hold before the key's next request leaves)."""
from __future__ import annotations

import asyncio

from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from hearth.ray.asgi_bridge import call_asgi, with_side_items


def _app(side: asyncio.Queue, release: asyncio.Event) -> FastAPI:
    app = FastAPI()

    @app.post("/run")
    async def run() -> StreamingResponse:
        side.put_nowait({"held": 7})  # (as the replica's reserve(), before the engine runs)
        await release.wait()  # the answer's head comes only now: the hold must not wait for it

        async def body():
            yield b"a"
            side.put_nowait({"held": 1})
            yield b"b"
        return StreamingResponse(body(), media_type="text/event-stream")
    return app


def test_side_items_go_out_as_soon_as_they_are_made() -> None:
    async def run() -> list:
        side: asyncio.Queue = asyncio.Queue()
        release = asyncio.Event()
        stream = with_side_items(call_asgi(_app(side, release), "POST", "/run", b"", [], b""), side)
        first = await asyncio.wait_for(stream.__anext__(), 5)  # before the head exists
        release.set()
        return [first] + [item async for item in stream]

    items = asyncio.run(run())
    holds = [i for i in items if isinstance(i, dict) and "held" in i]
    answer = [i for i in items if i not in holds]
    assert items[0] == {"held": 7} and holds == [{"held": 7}, {"held": 1}]
    assert answer[0]["status"] == 200 and answer[1:] == [b"a", b"b"]
    assert items.index({"held": 1}) < items.index(b"b")  # no later than the answer's next item


def test_closing_early_closes_the_answer() -> None:
    async def run() -> bool:
        side: asyncio.Queue = asyncio.Queue()
        release = asyncio.Event()
        inner = call_asgi(_app(side, release), "POST", "/run", b"", [], b"")
        stream = with_side_items(inner, side)
        assert await stream.__anext__() == {"held": 7}
        release.set()
        await stream.aclose()  # (a client that went away before reading the answer)
        return inner.ag_frame is None  # the bridge's generator has finished: its app saw the disconnect

    assert asyncio.run(run())
