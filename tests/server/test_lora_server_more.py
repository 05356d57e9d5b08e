"""LoRA through the real HTTP server, past vLLM's interface: a llama.cpp GGUF adapter in --lora-modules and loaded at
run time; llama-server's per-request `lora: [{"id", "scale"}]` (id: the --lora-modules position; its text is the
offline API's under that adapter and scale; an unknown id, two adapters, a conflicting `model` are 400s) and its
GET /lora-adapters; runtime load / unload while other requests stream; an API key whose `models` list names one adapter: it may use that adapter only, and
/v1/models, /lora-adapters show it only that; and all of it with -dp 2 (adapters reach every worker engine)."""
from __future__ import annotations

import httpx
import pytest

from hearth import LLM, SamplingParams
from hearth.lora.request import LoRARequest
from tests.gguf_lora_writer import write_gguf_adapter
from tests.lora_adapters import build_adapter
from tests.server.conftest import TINY_ARGS, start_server
from tests.tiny_models import build_checkpoint, tiny_config

ADMIN, USER, ONLY_A1 = "sk-more-admin", "sk-more-user", "sk-more-a1"
PROMPT = [5, 17, 42, 99, 7, 300, 12]
STEPS = 8


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("lora_more")
    base = build_checkpoint(str(root / "base"), tiny_config("llama"))
    a1 = build_adapter(base, str(root / "a1"), seed=1, r=4)
    a2 = build_adapter(base, str(root / "a2"), seed=2, r=8)
    return {"base": base, "a1": a1, "a2": a2, "g2": write_gguf_adapter(a2, base, str(root / "a2.gguf")),
            "g1": write_gguf_adapter(a1, base, str(root / "a1.gguf"))}


@pytest.fixture(scope="module")
def expected(files) -> dict[tuple[str | None, float], str]:
    """(adapter, scale) -> greedy text from the offline API with the PEFT folders."""
    llm = LLM(files["base"], dtype="float32", kv_cache_space=0.02, enable_lora=True, max_loras=3)
    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)
    cases = [(None, 1.0), ("a1", 1.0), ("a2", 1.0), ("a1", 0.5)]
    loras = [LoRARequest(n, 1 if n == "a1" else 2, files[n], scale=s) if n else None for n, s in cases]
    outs = llm.generate([{"prompt_token_ids": PROMPT}] * len(cases), params, lora_request=loras)
    texts = {c: o.outputs[0].text for c, o in zip(cases, outs)}
    assert len(set(texts.values())) == len(cases)
    return texts


@pytest.fixture(scope="module")
def server(files, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.toml"
    keys.write_text(f'admin_key = "{ADMIN}"\n\n[[keys]]\nname = "user"\nkey = "{USER}"\n\n'
                    f'[[keys]]\nname = "only-a1"\nkey = "{ONLY_A1}"\nmodels = ["a1"]\n')
    srv = start_server([files["base"], *TINY_ARGS, "--served-model-name", "tiny", "--dtype", "float32",
                        "--enable-lora", "--max-loras", "2", "--lora-modules", f"a1={files['a1']}",
                        f"g2={files['g2']}", "--api-key-file", str(keys)],
                       str(tmp_path_factory.mktemp("logs") / "lora_more.log"),
                       env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"})
    yield srv
    srv.stop()


def post(server, path: str, body: dict, key: str = USER) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def complete(server, key: str = USER, **body) -> httpx.Response:
    return post(server, "/v1/completions", {"model": "tiny", "prompt": PROMPT, "max_tokens": STEPS,
                                            "temperature": 0.0, "ignore_eos": True, **body}, key)


def text(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_a_gguf_adapter_by_name(server, expected) -> None:
    assert text(complete(server, model="g2")) == expected[("a2", 1.0)]


def test_llama_server_lora_field(server, expected) -> None:
    assert text(complete(server, lora=[{"id": 0, "scale": 1.0}])) == expected[("a1", 1.0)]
    assert text(complete(server, lora=[{"id": 1, "scale": 1.0}, {"id": 0, "scale": 0.0}])) == expected[("a2", 1.0)]
    assert text(complete(server, lora=[{"id": 0, "scale": 0.5}])) == expected[("a1", 0.5)]
    assert text(complete(server, lora=[{"id": 0, "scale": 0.0}])) == expected[(None, 1.0)]
    assert text(complete(server, lora=[])) == expected[(None, 1.0)]
    assert text(complete(server, model="a1", lora=[{"id": 0, "scale": 0.5}])) == expected[("a1", 0.5)]
    chat = post(server, "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                                 "max_tokens": 2, "lora": [{"id": 1, "scale": 1.0}]})
    assert chat.status_code == 200 and chat.json()["model"] == "g2"
    for body, words in (({"lora": [{"id": 7, "scale": 1.0}]}, "lora[0].id 7"),
                        ({"lora": [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.5}]}, "one adapter per request"),
                        ({"model": "a1", "lora": [{"id": 1, "scale": 1.0}]}, "names the adapter 'a1'"),
                        ({"lora": [{"id": 0}]}, "scale")):
        r = complete(server, **body)
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
        assert r.json()["error"]["param"].startswith("lora")
    r = complete(server, model="nope", lora=[{"id": 0, "scale": 1.0}])
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.get(server.url + "/lora-adapters", headers={"Authorization": f"Bearer {USER}"}, timeout=60)
    assert [(a["id"], a["name"]) for a in r.json()] == [(0, "a1"), (1, "g2")]


def test_a_key_allowed_one_adapter(server, expected) -> None:
    assert text(complete(server, ONLY_A1, model="a1")) == expected[("a1", 1.0)]
    for body in ({"model": "g2"}, {"model": "tiny"}, {"model": "a1", "lora": [{"id": 0, "scale": 0.0}]},
                 {"model": "a1", "lora": [{"id": 1, "scale": 1.0}, {"id": 0, "scale": 0.0}]}):
        r = complete(server, ONLY_A1, **body)
        assert 400 <= r.status_code < 500 and r.status_code != 404, (body, r.text)
    for body in ({"model": "g2"}, {"lora": [{"id": 1, "scale": 1.0}]}):  # g2 by name, and by its llama-server id
        r = complete(server, ONLY_A1, **body)
        assert r.status_code == 403 and r.json()["error"]["code"] == "model_not_allowed", r.text
    assert text(complete(server, ONLY_A1, lora=[{"id": 0, "scale": 1.0}])) == expected[("a1", 1.0)]
    headers = {"Authorization": f"Bearer {ONLY_A1}"}
    assert [m["id"] for m in httpx.get(server.url + "/v1/models", headers=headers, timeout=60).json()["data"]] == \
        ["a1"]
    assert [a["name"] for a in httpx.get(server.url + "/lora-adapters", headers=headers, timeout=60).json()] == ["a1"]
    assert httpx.get(server.url + "/lora-adapters", timeout=60).status_code == 401  # (it names adapter paths)
    r = post(server, "/v1/chat/completions", {"model": "g2", "messages": [{"role": "user", "content": "hi"}],
                                              "max_tokens": 2}, ONLY_A1)
    assert r.status_code == 403


def test_runtime_load_of_a_gguf_adapter(server, files, expected) -> None:
    r = post(server, "/v1/load_lora_adapter", {"lora_name": "g1", "lora_path": files["g1"]}, ADMIN)
    assert r.status_code == 200, r.text
    assert text(complete(server, model="g1")) == expected[("a1", 1.0)]
    assert text(complete(server, lora=[{"id": 2, "scale": 0.5}])) == expected[("a1", 0.5)]
    r = post(server, "/v1/load_lora_adapter", {"lora_name": "bad", "lora_path": files["base"] + "/config.json"},
             ADMIN)
    assert r.status_code == 400 and "not a GGUF adapter" in r.json()["error"]["message"]
    assert post(server, "/v1/unload_lora_adapter", {"lora_name": "g1"}, ADMIN).status_code == 200
    r = complete(server, lora=[{"id": 2, "scale": 1.0}])
    assert r.status_code == 400


@pytest.mark.slow
def test_adapters_reach_every_data_parallel_engine(files, expected, tmp_path) -> None:
    """-dp 2 (nobind: one physical core may hold two engines): --lora-modules and runtime loads go to both worker
    engines through the engine client; requests under adapters (by name and by llama-server id) spread over the
    engines give each adapter's own text."""
    import asyncio

    srv = start_server([files["base"], *TINY_ARGS, "--served-model-name", "tiny", "--dtype", "float32",
                        "--data-parallel-size", "2", "--omp-threads-bind", "nobind", "--enable-lora",
                        "--max-loras", "2", "--lora-modules", f"a1={files['a1']}", f"g2={files['g2']}"],
                       str(tmp_path / "dp.log"), env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"})
    try:
        models = {m["id"]: m for m in httpx.get(srv.url + "/v1/models", timeout=60).json()["data"]}
        assert set(models) == {"tiny", "a1", "g2"} and models["g2"]["parent"] == "tiny"
        r = httpx.post(srv.url + "/v1/load_lora_adapter", json={"lora_name": "g1", "lora_path": files["g1"]},
                       timeout=60)
        assert r.status_code == 200, r.text
        cases = [({"model": "a1"}, ("a1", 1.0)), ({"model": "g2"}, ("a2", 1.0)), ({"model": "tiny"}, (None, 1.0)),
                 ({"model": "g1"}, ("a1", 1.0)), ({"lora": [{"id": 0, "scale": 0.5}]}, ("a1", 0.5))] * 2

        async def run() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=srv.url, timeout=120) as client:
                return await asyncio.gather(*(client.post("/v1/completions", json={
                    "model": "tiny", "prompt": PROMPT, "max_tokens": STEPS, "temperature": 0.0, "ignore_eos": True,
                    **body}) for body, _ in cases))

        assert [text(r) for r in asyncio.run(run())] == [expected[want] for _, want in cases]
        per_engine = [srv.metric("vllm:request_success_total", engine=e) for e in ("0", "1")]
        assert all(n > 0 for n in per_engine), per_engine
    finally:
        srv.stop()


def test_runtime_load_and_unload_while_others_stream(server, files, expected) -> None:
    """Streams under a1 and the base keep going while g1 is loaded, used (sharing their steps) and unloaded: each
    stream ends complete with the text the same request gives on the idle server."""
    import asyncio
    import json

    tokens = 160

    async def stream(client: httpx.AsyncClient, model: str, started: asyncio.Event) -> str:
        body = {"model": model, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0.0, "ignore_eos": True,
                "stream": True}
        parts = []
        async with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    parts.append(json.loads(line[6:])["choices"][0]["text"])
                    started.set()
        return "".join(parts)

    async def run() -> tuple[list[str], int]:
        headers = {"Authorization": f"Bearer {USER}"}
        admin = {"Authorization": f"Bearer {ADMIN}"}
        async with httpx.AsyncClient(base_url=server.url, timeout=120, headers=headers) as client:
            models = ["a1", "tiny"] * 3
            events = [asyncio.Event() for _ in models]
            jobs = [asyncio.create_task(stream(client, m, e)) for m, e in zip(models, events)]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 60)
            r = await client.post("/v1/load_lora_adapter", json={"lora_name": "g1b", "lora_path": files["g1"]},
                                  headers=admin)
            assert r.status_code == 200, r.text
            r = await client.post("/v1/completions", json={"model": "g1b", "prompt": PROMPT, "max_tokens": STEPS,
                                                           "temperature": 0.0, "ignore_eos": True})
            assert text(r) == expected[("a1", 1.0)]
            r = await client.post("/v1/unload_lora_adapter", json={"lora_name": "g1b"}, headers=admin)
            assert r.status_code == 200
            in_flight = sum(not j.done() for j in jobs)
            return list(await asyncio.gather(*jobs)), in_flight

    texts, in_flight = asyncio.run(run())
    assert in_flight > 0  # (the load, the request under it and the unload all happened while streams ran)
    idle = {m: text(complete(server, model=m, max_tokens=tokens)) for m in ("a1", "tiny")}
    assert texts == [idle[m] for m in ["a1", "tiny"] * 3]
