"""The engine thread gives the kept heap back to the OS when the last request finishes (glibc keeps what steps free,
for the next steps), only when it keeps more than IDLE_GIVE_BACK_BYTES, and never between steps."""
from __future__ import annotations

import asyncio

import pytest

from hearth import LLM, SamplingParams, heap
from hearth.engine import async_engine
from hearth.engine.async_engine import AsyncEngine
from tests.tiny_models import build_checkpoint, tiny_config


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    folder = build_checkpoint(str(tmp_path_factory.mktemp("idle") / "ckpt"), tiny_config("llama"))
    return LLM(folder, dtype="float32", kv_cache_space=0.05, max_num_seqs=4)


def _serve_one(llm: LLM, monkeypatch: pytest.MonkeyPatch, kept: int) -> tuple[list[bool], int]:
    """One 6-token request; returns, per give_back call, whether requests were running then, and the step count."""
    engine = llm.engine
    calls: list[bool] = []
    steps = [0]
    step = engine.step

    def counting_step():
        steps[0] += 1
        return step()

    monkeypatch.setattr(engine, "step", counting_step)
    monkeypatch.setattr(heap, "free_bytes", lambda: kept)
    monkeypatch.setattr(heap, "give_back", lambda: calls.append(engine.has_unfinished_requests()))
    aeng = AsyncEngine(engine)
    aeng.start()

    async def run() -> None:
        stream = await aeng.generate([("r", list(range(5, 13)), SamplingParams(max_tokens=6, temperature=0.0,
                                                                               ignore_eos=True))])
        async for _ in stream:
            pass
        for _ in range(100):  # the engine thread reaches its idle check right after the last step's outputs
            if calls:
                break
            await asyncio.sleep(0.01)

    try:
        asyncio.run(run())
    finally:
        aeng.shutdown(timeout=30)
    return calls, steps[0]


def test_kept_heap_is_given_back_once_idle(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    calls, steps = _serve_one(llm, monkeypatch, async_engine.IDLE_GIVE_BACK_BYTES + 1)
    assert steps >= 6 and calls == [False]  # once, after the last step, never while the request ran


def test_little_kept_heap_is_kept(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    calls, _ = _serve_one(llm, monkeypatch, async_engine.IDLE_GIVE_BACK_BYTES)
    assert calls == []
