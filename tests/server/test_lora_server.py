"""LoRA adapters through the real HTTP server (vLLM's interface): --enable-lora with --lora-modules in both forms,
an adapter requested by name as `model` with the official openai client (its tokens are the offline API's under the
same adapter, not the base's), adapters and the base mixed in one batch, /v1/models listing adapters under their
parent, the Anthropic / Responses / Ollama routes taking an adapter name, an unknown name a 404 in OpenAI's shape,
and runtime load / unload behind the admin key (loading a name twice is a 400, a broken adapter a one-line 400)."""
from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from hearth import LLM, SamplingParams
from hearth.lora.request import LoRARequest
from tests.lora_adapters import build_adapter
from tests.server.conftest import TINY_ARGS, start_server
from tests.tiny_models import build_checkpoint, tiny_config

ADMIN, USER = "sk-lora-admin", "sk-lora-user"
PROMPT = [5, 17, 42, 99, 7, 300, 12]
STEPS = 8


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("lora_server")
    base = build_checkpoint(str(root / "base"), tiny_config("llama"))
    return {"base": base, **{name: build_adapter(base, str(root / name), seed=seed, r=r)
                             for name, seed, r in (("a1", 1, 4), ("a2", 2, 8), ("a3", 3, 2))}}


@pytest.fixture(scope="module")
def expected(folders) -> dict[str | None, str]:
    """Each adapter's greedy text from the offline API (the parity tests hold its tokens to transformers + PEFT)."""
    llm = LLM(folders["base"], dtype="float32", kv_cache_space=0.02, enable_lora=True, max_loras=3)
    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)
    names = [None, "a1", "a2", "a3"]
    loras = [LoRARequest(n, i, folders[n]) if n else None for i, n in enumerate(names)]
    outs = llm.generate([{"prompt_token_ids": PROMPT}] * len(names), params, lora_request=loras)
    texts = {n: o.outputs[0].text for n, o in zip(names, outs)}
    assert len(set(texts.values())) == len(names)  # (each adapter changes the text)
    return texts


@pytest.fixture(scope="module")
def server(folders, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.toml"
    keys.write_text(f'admin_key = "{ADMIN}"\n\n[[keys]]\nname = "user"\nkey = "{USER}"\n')
    a2 = json.dumps({"name": "a2", "path": folders["a2"], "base_model_name": "tiny-base"})
    srv = start_server([folders["base"], *TINY_ARGS, "--served-model-name", "tiny", "--dtype", "float32",
                        "--enable-lora", "--max-loras", "2", "--max-cpu-loras", "2",
                        "--lora-modules", f"a1={folders['a1']}", a2, "--api-key-file", str(keys)],
                       str(tmp_path_factory.mktemp("logs") / "lora.log"),
                       env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"})
    yield srv
    srv.stop()


def complete(client: openai.OpenAI, model: str) -> str:
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=STEPS, temperature=0.0,
                                  extra_body={"ignore_eos": True})
    assert r.model == model and r.usage.completion_tokens == STEPS
    return r.choices[0].text


def test_adapters_by_name_and_in_one_batch(server, expected) -> None:
    client = server.client(USER)
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {"tiny", "a1", "a2"}
    assert models["a1"].parent == "tiny" and models["a2"].parent == "tiny-base" and models["tiny"].parent is None
    assert complete(client, "a1") == expected["a1"] and complete(client, "tiny") == expected[None]

    async def together() -> list[str]:
        aclient = server.async_client(USER)
        rs = await asyncio.gather(*(aclient.completions.create(
            model=m, prompt=PROMPT, max_tokens=STEPS, temperature=0.0, extra_body={"ignore_eos": True})
            for m in ("a2", "tiny", "a1", "a2")))
        return [r.choices[0].text for r in rs]

    assert asyncio.run(together()) == [expected["a2"], expected[None], expected["a1"], expected["a2"]]
    chat = client.chat.completions.create(model="a2", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert chat.model == "a2" and chat.choices[0].message.content is not None


def test_an_unknown_adapter_is_a_404(server) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        server.client(USER).completions.create(model="a9", prompt=PROMPT, max_tokens=2)
    assert e.value.body["code"] == "model_not_found" and "a9" in e.value.body["message"]


def test_the_other_apis_take_an_adapter_name(server) -> None:
    headers = {"Authorization": f"Bearer {USER}"}
    calls = [("/v1/messages", {"model": "a1", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}),
             ("/v1/responses", {"model": "a1", "input": "hi", "max_output_tokens": 4}),
             ("/api/chat", {"model": "a1", "stream": False, "messages": [{"role": "user", "content": "hi"}],
                            "options": {"num_predict": 4}})]
    for path, body in calls:
        r = httpx.post(server.url + path, json=body, headers=headers, timeout=60)
        assert r.status_code == 200, (path, r.text)
    r = httpx.post(server.url + "/v1/messages", json={**calls[0][1], "model": "a9"}, headers=headers, timeout=60)
    assert r.status_code == 404 and r.json()["type"] == "error"


def test_runtime_load_and_unload(server, folders, expected, tmp_path) -> None:
    def post(path: str, body: dict, key: str = ADMIN) -> httpx.Response:
        return httpx.post(server.url + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)

    load = {"lora_name": "a3", "lora_path": folders["a3"]}
    r = post("/v1/load_lora_adapter", load, key=USER)
    assert r.status_code == 403 and r.json()["error"]["code"] == "admin_key_required"
    r = post("/v1/load_lora_adapter", load)
    assert r.status_code == 200 and "a3" in r.text
    client = server.client(USER)
    assert complete(client, "a3") == expected["a3"]
    r = post("/v1/load_lora_adapter", load)
    assert r.status_code == 400 and "already been loaded" in r.json()["error"]["message"]
    (tmp_path / "adapter_config.json").write_text("{}")
    (tmp_path / "adapter_model.safetensors").write_bytes(b"not safetensors")
    r = post("/v1/load_lora_adapter", {"lora_name": "broken", "lora_path": str(tmp_path)})
    assert r.status_code == 400 and "not a readable safetensors file" in r.json()["error"]["message"]
    r = post("/v1/load_lora_adapter", {"lora_name": "gone", "lora_path": str(tmp_path / "missing")})
    assert r.status_code == 400 and "no such folder" in r.json()["error"]["message"]
    assert post("/v1/unload_lora_adapter", {"lora_name": "a3"}).status_code == 200
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="a3", prompt=PROMPT, max_tokens=2)
    assert post("/v1/unload_lora_adapter", {"lora_name": "a3"}).status_code == 404
    assert {m.id for m in client.models.list().data} == {"tiny", "a1", "a2"}
    assert complete(client, "a1") == expected["a1"]  # (the server is unaffected)


def test_runtime_routes_need_the_opt_in(folders, tmp_path) -> None:
    """Without VLLM_ALLOW_RUNTIME_LORA_UPDATING the load / unload routes do not exist (vLLM's rule): with no keys on,
    they would let any client make the server read any folder."""
    srv = start_server([folders["base"], *TINY_ARGS, "--served-model-name", "tiny", "--dtype", "float32",
                        "--enable-lora", "--lora-modules", f"a1={folders['a1']}"], str(tmp_path / "closed.log"))
    try:
        r = httpx.post(srv.url + "/v1/load_lora_adapter", json={"lora_name": "a3", "lora_path": folders["a1"]},
                       timeout=60)
        assert r.status_code == 404
        assert "a1" in {m["id"] for m in httpx.get(srv.url + "/v1/models", timeout=60).json()["data"]}
    finally:
        srv.stop()
