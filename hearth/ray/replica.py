"""The model deployment: one hearth engine per Ray Serve replica, behind hearth's own FastAPI app (called in-process,
see asgi_bridge), so every answer is exactly what `hearth serve` would give. It pushes its metrics to the board."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from hearth.ray.asgi_bridge import call_asgi, with_side_items
from hearth.ray.metrics_board import BOARD_NAMESPACE, board_name
from hearth.ray.plan import ReplicaServerConfig

if TYPE_CHECKING:
    from hearth.entrypoints.openai.token_quota import QuotaLeft

logger = logging.getLogger("hearth")

REPLICA_HEADER = b"x-hearth-replica"
METRICS_PUSH_S = 1.0


def _load_on_own_thread(engine_args: Any) -> Any:
    """The LLMEngine, built as `hearth serve` builds it (hearth.engine.build: on a thread that then exits)."""
    from hearth.engine.build import build_engine

    return build_engine(engine_args)


class HearthModel:
    """Ray Serve deployment class (build_app wraps it with serve.deployment and its options)."""

    async def __init__(self, engine_kwargs: dict[str, Any], server: ReplicaServerConfig) -> None:
        from ray import serve

        from hearth.config import EngineArgs
        from hearth.entrypoints.openai.server import ServerConfig, build_app
        from hearth.entrypoints.openai.serving_build import build_serving

        context = serve.get_replica_context()
        self.name = context.replica_tag
        llm = await asyncio.to_thread(_load_on_own_thread, EngineArgs(**engine_kwargs))
        serving = build_serving(llm, server.serve)  # (as `hearth serve` assembles it: the same flags apply)
        self.engine = serving.client
        self.metrics = serving.client.metrics
        # NOTE: no API key here: the ingress checks it; a replica is reached only through a Ray handle.
        self.app = build_app(self.engine, serving.ctx, ServerConfig(None, server.max_body_bytes,
                                                                    server.drain_timeout), serving.gateway)
        self.drain_timeout = server.drain_timeout
        self.engine.start()  # (the app's lifespan does not run under in-process calls)
        self.board_name = board_name(context.app_name)
        self._pusher = asyncio.create_task(self._push_metrics())
        logger.info("replica %s serving %r", self.name, serving.ctx.model_name)

    async def __call__(self, method: str, path: str, query: bytes, headers: list[tuple[bytes, bytes]],
                       body: bytes, metered: bool = False, key: tuple[str, list[str] | None] | None = None,
                       quota: QuotaLeft | None = None) -> AsyncIterator[dict[str, Any] | bytes]:
        """The response's head, its body chunks, and (metered: the ingress counts a key's tokens) a last
        {"usage": [prompt, completion]} of the tokens this request used, for the key's limits. key: the name and
        model list of the ingress's key (what it may see and use here, whose stored responses are its own);
        quota: what was left of its tokens_per_day, which the request's tokens are reserved against here."""
        from hearth.entrypoints.openai.api_keys import KeySpec, current_key, current_meter
        from hearth.entrypoints.openai.token_quota import remote_meter

        if key is not None:  # NOTE: not reset, as the meter below
            name, models = key
            current_key.set(KeySpec(name, "", models=frozenset(models) if models is not None else None))
        holds: asyncio.Queue[dict[str, int]] = asyncio.Queue()
        meter = remote_meter(quota, lambda tokens: holds.put_nowait({"held": tokens}))
        usage = meter.usage
        if metered:  # (the serving layer reserves and adds each request's tokens to it, as under hearth serve)
            # NOTE: not reset: each handle call runs in its own task, whose context ends with it
            current_meter.set(meter)
        response = call_asgi(self.app, method, path, query, headers, body, [(REPLICA_HEADER, self.name.encode())])
        async for item in with_side_items(response, holds):  # each {"held": n} as soon as it is held
            yield item
        if metered:
            yield {"usage": [usage.prompt_tokens, usage.completion_tokens]}

    async def _push_metrics(self) -> None:
        import ray

        board = None
        while True:
            try:
                if board is None:
                    board = ray.get_actor(self.board_name, namespace=BOARD_NAMESPACE)
                await board.report.remote(self.name, self.metrics.render().decode())
            except Exception as e:  # noqa: BLE001 (no ingress yet, or a new one: look the board up again)
                board = None
                logger.debug("metrics push failed: %s", e)
            await asyncio.sleep(METRICS_PUSH_S)

    def check_health(self) -> None:
        """Ray Serve replaces a replica whose health check raises: a dead engine loop is one."""
        if self.engine.dead is not None:
            raise RuntimeError(f"the engine loop stopped: {self.engine.dead}")

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown(self.drain_timeout)
