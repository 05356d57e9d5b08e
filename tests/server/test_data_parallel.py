"""`hearth serve MODEL --data-parallel-size 2 --threads 1`: two engine processes behind one front, least-loaded
routing, metrics per `engine` label, and a killed engine failing only its own in-flight requests."""
from __future__ import annotations

import asyncio
import os
import re
import signal

import httpx
import openai
import pytest

from tests.server.conftest import ServerProcess, start_server, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dp(tiny_model: str, tmp_path_factory: pytest.TempPathFactory):
    srv = start_server([tiny_model, "--data-parallel-size", "2", "--threads", "1", "--kv-cache-space", "0.05"],
                       str(tmp_path_factory.mktemp("logs") / "dp.log"))
    yield srv
    srv.stop()


def _engines(srv: ServerProcess) -> dict:
    (model,) = srv.http.get("/models").json()["data"]
    return model


def test_sixteen_concurrent_requests_use_both_engines(dp: ServerProcess) -> None:
    model = _engines(dp)
    assert model["state"] == "loaded" and len(model["pids"]) == 2
    name = dp.client().models.list().data[0].id

    async def run() -> list:
        client = dp.async_client()
        jobs = [client.completions.create(model=name, prompt=f"hello {i}", max_tokens=8, extra_body={
            "ignore_eos": True}) for i in range(16)]
        return await asyncio.wait_for(asyncio.gather(*jobs), 120)

    outs = asyncio.run(run())
    assert all(o.usage.completion_tokens == 8 for o in outs)
    per_engine = {e: dp.metric("vllm:request_success_total", engine=e) for e in ("0", "1")}
    assert per_engine["0"] > 0 and per_engine["1"] > 0 and sum(per_engine.values()) == 16, per_engine
    assert dp.metric("vllm:generation_tokens_total") == 16 * 8
    cores = {dp.metric("hearth:bound_cores", engine=e) for e in ("0", "1")}
    assert cores == {1.0}  # one core each
    assert wait_until(lambda: dp.health()["kv_used_blocks"] == 0)


def test_killed_engine_fails_only_its_requests(dp: ServerProcess) -> None:
    name = dp.client().models.list().data[0].id
    victim = _engines(dp)["pids"][0]

    async def one(client: openai.AsyncOpenAI, i: int) -> str:
        try:
            stream = await client.completions.create(model=name, prompt=f"story {i}", max_tokens=240, stream=True,
                                                     extra_body={"ignore_eos": True})
            n = 0
            async for _chunk in stream:
                n += 1
                if n == 1 and i == 0:
                    os.kill(victim, signal.SIGKILL)
            return "ok"
        except openai.APIError as e:
            return str(e)

    async def run() -> list[str]:
        client = dp.async_client()
        return await asyncio.wait_for(asyncio.gather(*(one(client, i) for i in range(8))), 120)

    results = asyncio.run(run())
    failed = [r for r in results if r != "ok"]
    assert 0 < len(failed) < 8, results  # the other engine's requests finished
    assert all("engine" in r and "killed" in r for r in failed), failed
    # The front keeps serving (on the live engine, then on both once the dead one has restarted).
    out = dp.client().completions.create(model=name, prompt="again", max_tokens=4)
    assert out.usage.completion_tokens >= 1
    assert wait_until(lambda: len(_engines(dp)["pids"]) == 2 and victim not in _engines(dp)["pids"], 120)
    assert _engines(dp)["restarts"] == 1
    assert dp.health()["status"] == "ok"


def test_every_route_family_serves_behind_the_engines(dp: ServerProcess) -> None:
    """Responses, Anthropic Messages, Ollama and tokenize work in data-parallel mode too (one model, two engines)."""
    import anthropic
    import ollama

    name = dp.client().models.list().data[0].id
    assert wait_until(lambda: _engines(dp)["state"] == "loaded", 120)  # (an engine may be restarting)
    before = dp.metric("vllm:request_success_total")
    r = dp.client().responses.create(model=name, input="hello", max_output_tokens=4, extra_body={"ignore_eos": True})
    assert r.usage.output_tokens == 4
    a = anthropic.Anthropic(base_url=dp.url, api_key="none", max_retries=0)
    msg = a.messages.create(model=name, max_tokens=4, messages=[{"role": "user", "content": "hi"}],
                            extra_body={"ignore_eos": True})
    assert msg.usage.output_tokens == 4
    o = ollama.Client(host=dp.url, timeout=120)
    assert [m.model for m in o.list().models] == [f"{name}:latest"]
    out = o.generate(model=name, prompt="hello", raw=True, options={"num_predict": 3})
    assert out.done and out.eval_count >= 1
    assert dp.metric("vllm:request_success_total") == before + 3


def test_constraints_are_checked_by_the_engines(dp: ServerProcess) -> None:
    """A bad constraint is a 400 naming its field, compiled by a worker before the request is queued (as in
    process); a good one constrains the output."""
    assert wait_until(lambda: _engines(dp)["state"] == "loaded", 120)  # (an engine may be restarting)
    msgs = [{"role": "user", "content": "code?"}]
    r = httpx.post(dp.url + "/v1/chat/completions", json={"messages": msgs, "max_tokens": 5, "guided_regex": "[a-"},
                   timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "guided_regex", r.text
    r = httpx.post(dp.url + "/v1/chat/completions", json={"messages": msgs, "max_tokens": 8,
                                                           "guided_regex": "[a-z]{2}[0-9]{2}"}, timeout=120)
    assert r.status_code == 200, r.text
    assert re.fullmatch(r"[a-z]{2}[0-9]{2}", r.json()["choices"][0]["message"]["content"]), r.text
