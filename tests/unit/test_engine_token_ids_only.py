"""Token ids only inside the engine: the engine thread never calls the tokenizer. Text, stop strings and hidden stop
tokens are the front's output processor's, and the server's streams give the same texts as the offline API."""
from __future__ import annotations

import asyncio
import threading

import pytest

from hearth import LLM, SamplingParams
from hearth.engine.async_engine import AsyncEngine
from hearth.structured.params import StructuredOutputsParams
from tests.tiny_models import build_checkpoint, tiny_config

ENGINE_THREAD = "hearth-engine"


class EngineThreadForbidden:
    """Stands in for the tokenizer: any use on the engine thread raises (and is recorded, in case a caller there
    swallows the error); uses elsewhere are counted, so the test knows the text really came through it."""

    def __init__(self, inner: object) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "engine_thread_uses", [])
        object.__setattr__(self, "front_uses", 0)

    def __getattr__(self, name: str):
        if threading.current_thread().name == ENGINE_THREAD:
            self.engine_thread_uses.append(name)
            raise AssertionError(f"the engine thread used the tokenizer ({name})")
        object.__setattr__(self, "front_uses", self.front_uses + 1)
        return getattr(self._inner, name)

    def __len__(self) -> int:
        return len(self._inner)


@pytest.fixture(scope="module")
def llm(tmp_path_factory) -> LLM:
    folder = tmp_path_factory.mktemp("tokfree")
    build_checkpoint(str(folder), tiny_config("llama"))
    return LLM(str(folder), dtype="float32", max_model_len=64)


PROMPTS = [[5, 17, 42, 99, 7], [300, 12], list(range(60, 75))]


def _cases(llm: LLM) -> list[tuple[list[int], SamplingParams]]:
    greedy = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    ref = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy)
    stop = next(ref[0].outputs[0].text[i:i + 2] for i in range(2, 12)
                if ref[0].outputs[0].text[i:i + 2].isprintable())
    return [
        (PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, stop=stop)),
        (PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=12, logprobs=2, stop_token_ids=[7])),
        (PROMPTS[2], SamplingParams(temperature=0.8, seed=3, n=2, max_tokens=10, ignore_eos=True)),
        (PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=8,
                                    structured_outputs=StructuredOutputsParams(regex="[a-c]{3,6}"))),
    ]


async def _serve_all(engine: AsyncEngine, cases) -> list[dict[int, tuple[str, list[int], str | None]]]:
    async def one(i: int, ids: list[int], params: SamplingParams) -> dict[int, tuple[str, list[int], str | None]]:
        stream = await engine.generate([(f"r{i}", ids, params)])
        texts: dict[int, list] = {}
        async for out in stream:
            t = texts.setdefault(out.index, ["", [], None])
            t[0] += out.new_text
            t[1] += out.new_token_ids
            if out.finished:
                t[2] = out.stop_reason
        return {k: (v[0], v[1], v[2]) for k, v in texts.items()}

    return await asyncio.gather(*(one(i, ids, p) for i, (ids, p) in enumerate(cases)))


def test_the_engine_thread_never_calls_the_tokenizer(llm: LLM) -> None:
    cases = _cases(llm)
    offline = llm.generate([{"prompt_token_ids": ids} for ids, _ in cases], [p for _, p in cases])
    core = llm.engine
    real = core.tokenizer
    guard = EngineThreadForbidden(real)
    core.tokenizer = guard
    core.structured.compiler.tokenizer = guard
    engine = AsyncEngine(core)
    engine.start()
    try:
        served = asyncio.run(_serve_all(engine, cases))
    finally:
        engine.shutdown(10)
        core.tokenizer = real
        core.structured.compiler.tokenizer = real
    assert guard.engine_thread_uses == []
    assert guard.front_uses > 0
    for want, got in zip(offline, served):
        for out in want.outputs:
            assert got[out.index] == (out.text, out.token_ids, out.stop_reason)
    assert offline[0].outputs[0].finish_reason == "stop" and isinstance(offline[0].outputs[0].stop_reason, str)
    assert core.block_manager.num_used_blocks == 0
