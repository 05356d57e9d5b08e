"""The server's engine thread waits briefly after a step that finished requests, so a client's next request (sent
as its last one ends) joins the next step instead of waiting a whole step for it."""
from __future__ import annotations

import asyncio
import time

import pytest

from hearth import LLM, SamplingParams
from hearth.engine.async_engine import AsyncEngine
from tests.tiny_models import build_checkpoint, tiny_config

CLIENT_DELAY_S = 0.05  # the next request's HTTP round trip, as a client would take


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    folder = build_checkpoint(str(tmp_path_factory.mktemp("refill") / "ckpt"), tiny_config("llama"))
    return LLM(folder, dtype="float32", kv_cache_space=0.05, max_num_seqs=4)


def _steps_between_finish_and_next_start(llm: LLM, refill_wait_s: float) -> tuple[int, float]:
    """A long request keeps the engine stepping; a short one finishes, and CLIENT_DELAY_S later the client sends
    the next. Returns how many steps ran between the short one's last token and the next one's first, and the
    time that took."""
    engine = llm.engine
    steps = [0]
    step = engine.step

    def counting_step():
        steps[0] += 1
        return step()

    engine.step = counting_step
    aeng = AsyncEngine(engine, refill_wait_s=refill_wait_s)
    aeng.start()
    greedy = dict(temperature=0.0, ignore_eos=True)

    async def run() -> tuple[int, float]:
        long = await aeng.generate([("long", list(range(5, 20)), SamplingParams(max_tokens=200, **greedy))])
        short = await aeng.generate([("short", list(range(7, 15)), SamplingParams(max_tokens=3, **greedy))])
        async for _ in short:
            pass
        finished_at, t0 = steps[0], time.monotonic()
        await asyncio.sleep(CLIENT_DELAY_S)
        nxt = await aeng.generate([("next", list(range(9, 17)), SamplingParams(max_tokens=1, **greedy))])
        async for _ in nxt:
            pass
        result = steps[0] - finished_at - 1, time.monotonic() - t0
        long.abort()
        return result

    try:
        return asyncio.run(run())
    finally:
        aeng.shutdown(timeout=30)
        del engine.step


def test_next_request_joins_the_step_after_a_finish(llm: LLM) -> None:
    between, elapsed = _steps_between_finish_and_next_start(llm, refill_wait_s=5.0)
    assert between == 0
    assert elapsed < 2.5  # the wait ended when the request came, not after its 5 s


def test_without_the_wait_the_engine_steps_on(llm: LLM) -> None:
    between, _ = _steps_between_finish_and_next_start(llm, refill_wait_s=0.0)
    assert between >= 1
