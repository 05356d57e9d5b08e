"""Every route family on a multi-model server (`--models-config`), routed by the request's model: Responses,
Anthropic Messages (+ count_tokens), Ollama's /api/*, and the pooling routes (/v1/embeddings, /api/embed,
/v1/score, /v1/rerank); and the serving flags (--reasoning-parser, reasoning-budget) reaching each model.

Three tiny models, each in its own worker: `plain` (random llama), `think` (the reasoning checkpoint of
test_reasoning_fim: its budget of 4 forces </think>, so the split is deterministic) and `bert` (an encoder).
Which model answered is read from the per-model metrics, not only from the echoed name."""
from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import ollama
import pytest
import torch

from tests.server.conftest import ServerProcess, start_server
from tests.server.test_reasoning_fim import BUDGET, think_model  # noqa: F401 (a fixture)
from tests.tiny_encoders import build_bert, hf_embed

pytestmark = pytest.mark.slow

ASK = [{"role": "user", "content": "The quick brown fox"}]
FREE = {"ignore_eos": True}


@pytest.fixture(scope="module")
def routed(tiny_model: str, think_model: str, tmp_path_factory: pytest.TempPathFactory  # noqa: F811
           ) -> Iterator[ServerProcess]:
    d = tmp_path_factory.mktemp("routed")
    bert = build_bert(str(d / "bert"), max_seq_length=32)
    # --reasoning-parser comes from the command line (every model), the budget from think's own entry
    (d / "models.toml").write_text(
        f'[[models]]\nname = "plain"\npath = "{tiny_model}"\n\n'
        f'[[models]]\nname = "think"\npath = "{think_model}"\nreasoning-budget = {BUDGET}\n\n'
        f'[[models]]\nname = "bert"\npath = "{bert}"\ndtype = "float32"\n')
    srv = start_server(["--models-config", str(d / "models.toml"), "--kv-cache-space", "0.05", "--threads", "1",
                        "--reasoning-parser", "qwen3"], str(d / "routed.log"))
    srv.bert = bert
    yield srv
    srv.stop()


def _served(srv: ServerProcess, model: str) -> float:
    return srv.metric("vllm:request_success_total", model_name=model)


def test_responses_and_messages_route_by_model(routed: ServerProcess) -> None:
    client = routed.client()
    before = {m: _served(routed, m) for m in ("plain", "think")}
    plain = client.responses.create(model="plain", input="The quick brown fox", max_output_tokens=6,
                                    temperature=0, extra_body=FREE)
    think = client.responses.create(model="think", input="The quick brown fox", max_output_tokens=12,
                                    temperature=0, extra_body=FREE)
    assert plain.model == "plain" and [o.type for o in plain.output] == ["message"]
    # the reasoning parser (a command-line flag) and think's budget (its TOML entry, which forces </think>: random
    # weights would not write it) reached its model
    assert think.model == "think" and [o.type for o in think.output] == ["reasoning", "message"]
    assert {m: _served(routed, m) - before[m] for m in before} == {"plain": 1, "think": 1}
    # two resident models compute on cores of their own (hearth.engine.core_slots), one each with --threads 1
    cores = {m["name"]: m["bound_cores"] for m in routed.http.get("/models").json()["data"]}
    assert len(cores["plain"][0]) == len(cores["think"][0]) == 1 and cores["plain"] != cores["think"]

    a = anthropic.Anthropic(base_url=routed.url, api_key="none", max_retries=0)
    msg = a.messages.create(model="think", max_tokens=12, messages=ASK, extra_body={**FREE, "temperature": 0})
    assert msg.model == "think" and [b.type for b in msg.content] == ["thinking", "text"]
    streamed = list(a.messages.create(model="plain", max_tokens=5, messages=ASK, stream=True, extra_body=FREE))
    assert streamed[0].message.model == "plain" and streamed[-1].type == "message_stop"
    assert a.messages.count_tokens(model="plain", messages=ASK).input_tokens > 0
    with pytest.raises(anthropic.NotFoundError) as e:
        a.messages.create(model="nope", max_tokens=2, messages=ASK)
    assert "plain, think, bert" in e.value.body["error"]["message"]
    assert _served(routed, "think") - before["think"] == 2 and _served(routed, "plain") - before["plain"] == 2
    status = {m["name"]: m for m in routed.http.get("/status").json()["models"]}  # the web page's status view
    assert status["think"]["generation_tokens_total"] == 12 + 12 and status["bert"]["state"] == "unloaded"
    assert status["think"]["generation_tokens_per_s"] is not None


def test_ollama_routes_list_and_route(routed: ServerProcess) -> None:
    c = ollama.Client(host=routed.url, timeout=120)
    routed.client().completions.create(model="plain", prompt="hi", max_tokens=1)  # plain is loaded
    assert {m.model for m in c.list().models} == {"plain:latest", "think:latest", "bert:latest"}
    assert "plain:latest" in {m.model for m in c.ps().models}  # the loaded ones
    before = _served(routed, "think")
    r = c.chat(model="think:latest", messages=ASK, options={"temperature": 0, "num_predict": 10}, think=True)
    assert r.model == "think:latest" and r.message.thinking and _served(routed, "think") == before + 1
    parts = list(c.generate(model="plain", prompt="The quick brown fox", raw=True, stream=True,
                            options={"temperature": 0, "num_predict": 4}))
    assert parts[-1].done and parts[-1].eval_count >= 1
    shown = c.show("think")
    assert "thinking" in shown.capabilities and shown.modelinfo["llama.context_length"] == 256
    with pytest.raises(ollama.ResponseError, match="not found") as e:
        c.chat(model="llama3", messages=ASK)
    assert e.value.status_code == 404 and "'plain:latest'" in str(e.value)


def test_pooling_routes_on_the_encoder(routed: ServerProcess) -> None:
    texts = ["the quick brown fox", "what is hearth?"]
    r = routed.client().embeddings.create(model="bert", input=texts)
    torch.testing.assert_close(torch.tensor([d.embedding for d in r.data]), hf_embed(routed.bert, texts),
                               atol=1e-5, rtol=1e-4)
    e = ollama.Client(host=routed.url, timeout=120).embed(model="bert:latest", input=texts[0])
    assert e.embeddings[0] == pytest.approx(r.data[0].embedding, abs=1e-5)
    # score and rerank reach the model too (an embedding model does not score: its worker says so, a 400)
    for path, body in (("/v1/score", {"text_1": "a", "text_2": "b"}),
                       ("/v1/rerank", {"query": "a", "documents": ["b"]})):
        resp = httpx.post(routed.url + path, json={"model": "bert", **body}, timeout=60)
        assert resp.status_code == 400, (path, resp.text)
        assert httpx.post(routed.url + path, json={"model": "nope", **body}, timeout=10).status_code == 404
    assert routed.health()["kv_used_blocks"] == 0
