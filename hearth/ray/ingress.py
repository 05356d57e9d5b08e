"""The ingress deployment: the HTTP face of a Ray Serve hearth. It checks the API key, its limits (--api-key-file:
requests, tokens the replicas report back, models) and body size (hearth's Guard),
relays every route to a model replica through a Ray handle (Ray Serve picks the least-loaded), streams SSE through,
and serves /metrics merged from what the replicas push."""
from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from hearth import __version__
from hearth.entrypoints.openai.api_keys import KeyRing, KeySpec, Meter, current_key, current_meter
from hearth.entrypoints.openai.errors import APIError, error_body, install_handlers
from hearth.entrypoints.openai.serving_common import sse
from hearth.entrypoints.openai.token_quota import Charge, has_quota, quota_left, reserve
from hearth.metrics import CONTENT_TYPE
from hearth.ray.metrics_board import BOARD_NAMESPACE, MetricsBoard, board_name, merge_expositions

_HOP_HEADERS = {b"content-length", b"transfer-encoding", b"connection"}


def _unavailable(e: BaseException) -> JSONResponse:
    return JSONResponse(error_body(f"no model replica could answer ({type(e).__name__}: {e}); retry shortly",
                                   "server_error", None, "replica_unavailable"), status_code=503)


class HearthIngress:
    """Ray Serve deployment class (wrapped by serve.ingress and serve.deployment in build_app)."""

    async def __init__(self, model: Any, api_key: str | None, max_body_bytes: int,
                       key_specs: list[KeySpec] | None = None) -> None:
        self.model = model  # DeploymentHandle of HearthModel
        self.api_key, self.max_body_bytes = api_key, max_body_bytes
        self.key_specs = key_specs  # --api-key-file's keys and limits (read by build_app)
        self._quota_turns: dict[str, asyncio.Lock] = {}  # per key with a tokens_per_day: see _relay
        from ray import serve

        self.board = MetricsBoard.options(name=board_name(serve.get_replica_context().app_name),
                                          namespace=BOARD_NAMESPACE, get_if_exists=True).remote()

    def __serve_build_asgi_app__(self) -> FastAPI:
        from hearth.entrypoints.openai.guard import Guard
        from hearth.entrypoints.openai import serving_keys
        from hearth.entrypoints.openai.serving_keys import key_ring

        app = FastAPI(title="hearth (Ray Serve)", version=__version__)
        install_handlers(app)
        keys = KeyRing(self.key_specs) if self.key_specs else key_ring(self.api_key, None, None)
        app.add_middleware(Guard, keys=keys, max_body_bytes=self.max_body_bytes)
        serving_keys.register(app, keys)  # GET /keys/usage (the admin key), before the relay's catch-all

        @app.get("/metrics")
        async def metrics() -> Response:
            return Response(merge_expositions(await self.board.live.remote()), media_type=CONTENT_TYPE)

        @app.get("/version")
        async def version() -> dict:
            return {"version": __version__}

        @app.api_route("/{path:path}", methods=["GET", "POST"])
        async def relay(raw: Request) -> Response:
            return await self._relay(raw)

        return app

    async def _relay(self, raw: Request) -> Response:
        body = await raw.body()
        headers = [(k, v) for k, v in raw.headers.raw if k != b"authorization"]
        meter = current_meter.get()  # (set by the Guard for a keyed generating request: count its tokens)
        spec = current_key.get()  # the replica's routes decide what this key may see and use (model_access)
        key = (spec.name, sorted(spec.models) if spec.models is not None else None) if spec is not None else None
        # The replica holds the request's tokens against what is left of the key's quota (token_quota.reserve) and
        # says so first; a key's requests leave one at a time until then, so each allowance counts the last hold.
        turn = self._quota_turns.setdefault(meter.name, asyncio.Lock()) if has_quota() else contextlib.nullcontext()
        charge: Charge | None = None
        gen = None
        try:
            async with turn:
                gen = self.model.options(stream=True).remote(raw.method, raw.url.path, raw.url.query.encode(),
                                                             headers, body, meter is not None, key, quota_left())
                head = await gen.__anext__()
                if "held" in head:
                    charge = reserve(head["held"])  # (it fits: the replica held it in what was left)
            while "held" in head:  # (a later hold was checked by the replica against the same allowance)
                head = await gen.__anext__()
        except APIError:
            gen.cancel()
            raise
        except Exception as e:  # noqa: BLE001 (a dead or overloaded replica, whatever Ray calls it)
            if gen is not None:
                gen.cancel()
            if charge is not None:
                charge.close()
            return _unavailable(e)
        out_headers = {k.decode(): v.decode() for k, v in head["headers"] if k not in _HOP_HEADERS}
        if out_headers.get("content-type", "").startswith("text/event-stream"):
            chunks = self._stream(gen, meter, charge)
            if charge is not None:  # (a stream never iterated, its client gone first, still gives its hold back)
                weakref.finalize(chunks, charge.close)
            return StreamingResponse(chunks, status_code=head["status"], headers=out_headers)
        try:
            data = b"".join([chunk async for chunk in _counted(gen, meter, charge)])
        except Exception as e:  # noqa: BLE001
            return _unavailable(e)
        return Response(data, status_code=head["status"], headers=out_headers)

    @staticmethod
    async def _stream(gen: Any, meter: Meter | None, charge: Charge | None) -> AsyncIterator[bytes]:
        """NOTE: a client that goes away closes this generator; cancelling the handle call then reaches the replica,
        whose app sees a disconnect and aborts the request (freeing its KV blocks)."""
        finished = False
        try:
            async for chunk in _counted(gen, meter, charge):
                yield chunk
            finished = True
        except Exception as e:  # noqa: BLE001 (the replica died mid-stream)
            finished = True
            yield (sse(error_body(f"the model replica failed mid-stream ({type(e).__name__}: {e})",
                                  "server_error", None, "replica_unavailable")) + "data: [DONE]\n\n").encode()
        finally:
            if not finished:
                gen.cancel()


async def _counted(gen: Any, meter: Meter | None, charge: Charge | None) -> AsyncIterator[bytes]:
    """The body chunks; the replica's last {"usage": [prompt, completion]} goes to the key's counters (from what
    the request held, when it held some: what it did not use goes back when it ends)."""
    try:
        async for item in gen:
            if isinstance(item, dict):
                if "usage" in item and charge is not None:
                    charge.use(*item["usage"])
                elif "usage" in item and meter is not None:
                    meter.ring.add_tokens(meter.name, meter.usage, *item["usage"])
                continue
            yield item
    finally:
        if charge is not None:
            charge.close()
