"""/v1/embeddings, /v1/score, /v1/rerank and Ollama's /api/embed on tiny random BERT servers (real HTTP, the
official openai and ollama clients), checked against transformers."""
import asyncio
import base64

import httpx
import numpy as np
import pytest
import torch

from tests.server.conftest import start_server
from tests.tiny_encoders import build_bert, hf_embed, hf_scores

TEXTS = ["the quick brown fox", "paris is the capital of france " * 3, "a", "what is hearth?"]
ARGS = ["--dtype", "float32", "--threads", "1"]
KEY = "sekrit"


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> str:
    # is_matryoshka: so that `dimensions` is allowed
    return build_bert(str(tmp_path_factory.mktemp("bert") / "bert"), max_seq_length=32, is_matryoshka=True)


@pytest.fixture(scope="module")
def embed_server(bert: str, tmp_path_factory):
    srv = start_server([bert, *ARGS, "--served-model-name", "tiny-bert", "--api-key", KEY],
                       str(tmp_path_factory.mktemp("logs") / "bert.log"))
    srv.http.headers["Authorization"] = f"Bearer {KEY}"
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory) -> str:
    return build_bert(str(tmp_path_factory.mktemp("ce") / "ce"), cross_encoder=True)


@pytest.fixture(scope="module")
def score_server(cross_encoder: str, tmp_path_factory):
    srv = start_server([cross_encoder, *ARGS, "--task", "score"], str(tmp_path_factory.mktemp("logs") / "ce.log"))
    yield srv
    srv.stop()


def test_embeddings_inputs_and_usage(embed_server, bert) -> None:
    client = embed_server.client(KEY)
    ref = hf_embed(bert, TEXTS)
    r = client.embeddings.create(model="tiny-bert", input=TEXTS)  # the client asks for base64 and decodes it
    assert [d.index for d in r.data] == [0, 1, 2, 3]
    torch.testing.assert_close(torch.tensor([d.embedding for d in r.data]), ref, atol=1e-5, rtol=1e-4)
    ids = [embed_server.http.post("/tokenize", json={"prompt": t}).json()["tokens"] for t in TEXTS]
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(map(len, ids))
    one = client.embeddings.create(model="tiny-bert", input=TEXTS[1], encoding_format="float")
    assert one.data[0].embedding == pytest.approx(r.data[1].embedding, abs=1e-6)
    by_ids = client.embeddings.create(model="tiny-bert", input=ids, encoding_format="float")
    torch.testing.assert_close(torch.tensor([d.embedding for d in by_ids.data]), ref, atol=1e-5, rtol=1e-4)
    single = client.embeddings.create(model="tiny-bert", input=ids[3], encoding_format="float")
    assert single.data[0].embedding == pytest.approx(by_ids.data[3].embedding, abs=1e-6)


def test_base64_is_little_endian_float32(embed_server) -> None:
    body = {"input": TEXTS[0]}
    floats = embed_server.http.post("/v1/embeddings", json={**body, "encoding_format": "float"}).json()
    b64 = embed_server.http.post("/v1/embeddings", json={**body, "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, np.array(floats["data"][0]["embedding"], dtype=np.float32))


def test_dimensions_and_normalize(embed_server, bert) -> None:
    client = embed_server.client(KEY)
    full = hf_embed(bert, TEXTS[:2], normalize=False)
    r = client.embeddings.create(model="tiny-bert", input=TEXTS[:2], dimensions=16)
    got = torch.tensor([d.embedding for d in r.data])
    torch.testing.assert_close(got, torch.nn.functional.normalize(full[:, :16], dim=-1), atol=1e-5, rtol=1e-4)
    raw = embed_server.http.post("/v1/embeddings", json={"input": TEXTS[:2], "normalize": False,
                                                         "encoding_format": "float"}).json()
    torch.testing.assert_close(torch.tensor([d["embedding"] for d in raw["data"]]), full, atol=1e-5, rtol=1e-4)
    bad = embed_server.http.post("/v1/embeddings", json={"input": "a", "dimensions": 65})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "dimensions"


def test_over_length_and_truncation(embed_server, bert) -> None:
    http = embed_server.http
    long = "the quick brown fox jumps over the lazy dog " * 8  # 74 tokens, past max_seq_length 32
    r = http.post("/v1/embeddings", json={"input": [TEXTS[0], long]})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "input" and "maximum input length is 32" in r.json()["error"]["message"]
    ok = http.post("/v1/embeddings", json={"input": long, "truncate_prompt_tokens": -1, "encoding_format": "float"})
    assert ok.status_code == 200 and ok.json()["usage"]["prompt_tokens"] == 32
    # the head of the text and its [SEP], as transformers (and sentence-transformers) truncate
    ref = hf_embed(bert, [" ".join(long.split()[:30])])[0]
    torch.testing.assert_close(torch.tensor(ok.json()["data"][0]["embedding"]), ref, atol=1e-5, rtol=1e-4)
    ids = list(range(5, 45))
    tail = http.post("/v1/embeddings", json={"input": ids, "truncate_prompt_tokens": 8, "encoding_format": "float"})
    alone = http.post("/v1/embeddings", json={"input": ids[-8:], "encoding_format": "float"})
    assert tail.json()["data"][0]["embedding"] == pytest.approx(alone.json()["data"][0]["embedding"], abs=1e-6)
    too_many = http.post("/v1/embeddings", json={"input": "a", "truncate_prompt_tokens": 33})
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "truncate_prompt_tokens"


def test_errors_leave_the_engine_serving(embed_server) -> None:
    http = embed_server.http
    assert http.post("/v1/embeddings", json={"input": []}).status_code == 400
    assert http.post("/v1/embeddings", json={"input": [[]]}).status_code == 400
    assert http.post("/v1/embeddings", json={"input": [10 ** 6]}).status_code == 400
    assert http.post("/v1/embeddings", json={"input": {"x": 1}}).status_code == 400
    assert http.post("/v1/embeddings", json={"input": "a", "model": "other"}).status_code == 404
    gen = http.post("/v1/completions", json={"prompt": "hello", "max_tokens": 2})
    assert gen.status_code == 400 and "pooling" in gen.json()["error"]["message"]
    assert http.post("/v1/score", json={"text_1": "a", "text_2": "b"}).status_code == 400
    assert http.post("/v1/embeddings", json={"input": "a"}).status_code == 200
    assert embed_server.health()["num_requests_waiting"] == 0


def test_concurrent_requests_batch(embed_server, bert) -> None:
    client = embed_server.async_client(KEY)

    async def run():
        return await asyncio.gather(*[client.embeddings.create(model="tiny-bert", input=[t] * 3) for t in TEXTS * 4])

    results = asyncio.run(run())
    ref = hf_embed(bert, TEXTS)
    for i, r in enumerate(results):
        torch.testing.assert_close(torch.tensor(r.data[2].embedding), ref[i % len(TEXTS)], atol=1e-5, rtol=1e-4)


def test_ollama_embed(embed_server, bert) -> None:
    import ollama

    client = ollama.Client(host=embed_server.url, headers={"Authorization": f"Bearer {KEY}"})
    r = client.embed(model="tiny-bert", input=TEXTS)
    torch.testing.assert_close(torch.tensor(r.embeddings), hf_embed(bert, TEXTS), atol=1e-5, rtol=1e-4)
    assert r.prompt_eval_count > 0
    one = client.embed(model="tiny-bert:latest", input=TEXTS[0])
    assert one.embeddings[0] == pytest.approx(r.embeddings[0], abs=1e-6)
    old = client.embeddings(model="tiny-bert", prompt=TEXTS[0])
    assert list(old.embedding) == pytest.approx(r.embeddings[0], abs=1e-6)
    with pytest.raises(ollama.ResponseError, match="not found"):
        client.embed(model="llama3", input="a")
    long = embed_server.http.post("/api/embed", json={"model": "tiny-bert", "input": "fox " * 40, "truncate": False})
    assert long.status_code == 400 and "maximum input length" in long.json()["error"]
    for route in ("/api/embed", "/api/embeddings", "/v1/embeddings"):  # --api-key guards these routes too
        assert httpx.post(embed_server.url + route, json={"input": "a", "prompt": "a"}).status_code == 401


def test_score_and_rerank(score_server, cross_encoder) -> None:
    http = score_server.http
    query = "what is the capital of france?"
    ref = hf_scores(cross_encoder, [(query, t) for t in TEXTS])
    r = http.post("/v1/score", json={"text_1": query, "text_2": TEXTS}).json()
    assert [d["index"] for d in r["data"]] == [0, 1, 2, 3] and r["object"] == "list"
    torch.testing.assert_close(torch.tensor([d["score"] for d in r["data"]]), ref, atol=1e-5, rtol=1e-4)
    assert r["usage"]["prompt_tokens"] > 0
    pairwise = http.post("/v1/score", json={"text_1": TEXTS[:2], "text_2": TEXTS[2:]}).json()
    ref2 = hf_scores(cross_encoder, list(zip(TEXTS[:2], TEXTS[2:])))
    torch.testing.assert_close(torch.tensor([d["score"] for d in pairwise["data"]]), ref2, atol=1e-5, rtol=1e-4)
    assert http.post("/v1/score", json={"text_1": TEXTS[:2], "text_2": TEXTS}).status_code == 400
    rr = http.post("/v1/rerank", json={"query": query, "documents": TEXTS, "top_n": 3}).json()
    order = torch.argsort(ref, descending=True)[:3].tolist()
    assert [x["index"] for x in rr["results"]] == order
    assert [x["document"]["text"] for x in rr["results"]] == [TEXTS[i] for i in order]
    assert rr["results"][0]["relevance_score"] == pytest.approx(float(ref[order[0]]), abs=1e-5)
    emb = http.post("/v1/embeddings", json={"input": "a"})
    assert emb.status_code == 400 and "cross-encoder" in emb.json()["error"]["message"]
