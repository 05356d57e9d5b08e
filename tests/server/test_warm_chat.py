"""The chat-template renderer is warmed only once the engine has been quiet for a while, never beside requests."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from hearth.entrypoints.openai.server import warm_when_idle


def test_warm_up_waits_for_an_idle_engine() -> None:
    engine = SimpleNamespace(stats=SimpleNamespace(num_running=1, num_waiting=0))
    calls: list[float] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(warm_when_idle(engine, lambda: calls.append(loop.time()), idle_s=0.2,
                                                  poll_s=0.01))
        await asyncio.sleep(0.4)  # busy all along: no warm-up
        assert not calls
        engine.stats = SimpleNamespace(num_running=0, num_waiting=0)
        quiet_since = loop.time()
        await asyncio.wait_for(task, 5)
        assert len(calls) == 1 and calls[0] - quiet_since >= 0.15

    asyncio.run(scenario())


def test_a_failing_warm_up_is_harmless() -> None:
    engine = SimpleNamespace(stats=SimpleNamespace(num_running=0, num_waiting=0))

    def boom() -> None:
        raise ValueError("template cannot render a plain message")

    asyncio.run(warm_when_idle(engine, boom, idle_s=0.02, poll_s=0.01))
