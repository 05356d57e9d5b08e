"""A model a request has asked the router for is busy until that request's response ends (HoldModels), so another
model's load cannot unload it between the request getting its serving context and submitting to its engine."""
from __future__ import annotations

import asyncio

import pytest

from hearth.config import EngineArgs
from hearth.entrypoints.openai.errors import APIError
from hearth.entrypoints.openai.model_router import HoldModels, ModelRouter, RouterConfig
from hearth.entrypoints.openai.model_specs import ModelSpec


class _LoadedEngine:
    """What the router reads of a loaded model's engine, with nothing in flight."""
    loading, dead, in_flight, info, size = False, None, 0, None, 1

    def __init__(self) -> None:
        self.shut = False

    def shutdown(self, timeout: float) -> None:
        self.shut = True

    async def exited(self, timeout: float) -> None:
        return None


def _router() -> tuple[ModelRouter, _LoadedEngine]:
    router = ModelRouter([ModelSpec("a", "/nowhere/a.gguf"), ModelSpec("b", "/nowhere/b.gguf")], EngineArgs(),
                         RouterConfig(max_loaded_models=1, load_timeout=0.3))
    a = router.resolve("a")
    a.engine, a.ctx = _LoadedEngine(), object()
    return router, a.engine


def test_a_request_holds_its_model_until_its_response_ends() -> None:
    router, engine = _router()
    seen: dict[str, object] = {}

    async def app(scope, receive, send) -> None:  # a route: its context, then (before submitting) another load
        await router.context("a")
        seen["busy"] = router.resolve("a").busy
        with pytest.raises(APIError) as e:
            await router.context("b")  # would unload "a" to make room: it must wait for it, then give up
        seen["code"] = e.value.code

    async def run() -> None:
        await HoldModels(app)({"type": "http"}, None, None)

    asyncio.run(run())
    assert seen == {"busy": True, "code": "models_busy"}
    assert not engine.shut and router.resolve("a").holds == 0 and not router.resolve("a").busy


def test_without_the_middleware_context_holds_nothing() -> None:
    router, _ = _router()
    asyncio.run(router.context("a"))  # (the offline or test use of a router: no request scope)
    assert router.resolve("a").holds == 0 and not router.resolve("a").busy
