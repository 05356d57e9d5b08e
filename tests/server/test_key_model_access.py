"""A key limited to some models (`models = [...]` in --api-key-file) can neither touch nor name any other, on
every route of every API family (issue 44, item 4): tokenize, detokenize and Ollama's /api/show are refused (and
counted against the key's limits), and /api/tags, /api/ps, /status and /v1/models list only its models."""
from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.server.conftest import ServerProcess, start_server

ADMIN, SMALL, ANY = "sk-admin-x", "sk-small-only", "sk-any-model"
KEY_FILE = f"""
admin_key = "{ADMIN}"

[[keys]]
name = "small-only"
key = "{SMALL}"
models = ["small"]

[[keys]]
name = "any"
key = "{ANY}"
"""


def _h(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _refused(r: httpx.Response) -> None:
    assert r.status_code == 403, r.text
    body = r.json()
    if r.request.url.path.startswith("/api/"):  # Ollama's error shape
        assert "may not use the model" in body["error"]
    else:
        assert body["error"]["code"] == "model_not_allowed" and body["error"]["param"] == "model"


@pytest.fixture(scope="module")
def router(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    d = tmp_path_factory.mktemp("access")
    (d / "keys.toml").write_text(KEY_FILE)
    (d / "models.toml").write_text(f'[[models]]\nname = "small"\npath = "{tiny_model}"\n\n'
                                   f'[[models]]\nname = "other"\npath = "{tiny_model}"\n')
    srv = start_server(["--models-config", str(d / "models.toml"), "--max-loaded-models", "1",
                        "--api-key-file", str(d / "keys.toml"), "--kv-cache-space", "0.05", "--threads", "1"],
                       str(d / "access.log"))
    yield srv
    srv.stop()


def _states(srv: ServerProcess) -> dict[str, str]:
    return {m["name"]: m["state"] for m in srv.http.get("/models", headers=_h(ADMIN)).json()["data"]}


def test_a_limited_key_cannot_load_or_evict_another_model(router: ServerProcess) -> None:
    with httpx.Client(base_url=router.url, timeout=120, headers=_h(SMALL)) as c:
        assert c.post("/tokenize", json={"model": "small", "prompt": "hi"}).status_code == 200
        assert _states(router) == {"small": "loaded", "other": "unloaded"}
        for r in (c.post("/tokenize", json={"model": "other", "prompt": "hi"}),
                  c.post("/detokenize", json={"model": "other", "tokens": [1, 2]}),
                  c.post("/api/show", json={"model": "other"}),
                  c.post("/api/show", json={"name": "other:latest"}),
                  c.post("/v1/completions", json={"model": "other", "prompt": "hi", "max_tokens": 1}),
                  c.post("/v1/messages", json={"model": "other", "max_tokens": 1,
                                               "messages": [{"role": "user", "content": "hi"}]}),
                  c.post("/api/generate", json={"model": "other", "prompt": "hi", "stream": False})):
            if r.request.url.path == "/v1/messages":
                assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error", r.text
            else:
                _refused(r)
        assert _states(router) == {"small": "loaded", "other": "unloaded"}  # never loaded, small never evicted
        # it sees only its own model, in every listing
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["small"]
        assert [m["name"] for m in c.get("/api/tags").json()["models"]] == ["small:latest"]
        assert [m["name"] for m in c.get("/api/ps").json()["models"]] == ["small:latest"]
        assert [m["name"] for m in c.get("/status").json()["models"]] == ["small"]
        # an unknown name is refused the same way: the key learns nothing about what else is served
        _refused(c.post("/tokenize", json={"model": "nope", "prompt": "hi"}))
    with httpx.Client(base_url=router.url, timeout=120, headers=_h(ANY)) as c:  # a key without a list: all
        assert sorted(m["name"] for m in c.get("/status").json()["models"]) == ["other", "small"]
        assert len(c.get("/api/tags").json()["models"]) == 2


def test_tokenize_and_show_count_against_the_key(router: ServerProcess) -> None:
    before = router.metric("hearth:key_requests_total", key_name="small-only")
    with httpx.Client(base_url=router.url, timeout=120, headers=_h(SMALL)) as c:
        assert c.post("/tokenize", json={"model": "small", "prompt": "hi"}).status_code == 200
        assert c.post("/detokenize", json={"model": "small", "tokens": [1, 2]}).status_code == 200
        assert c.post("/api/show", json={"model": "small"}).status_code == 200
    assert router.metric("hearth:key_requests_total", key_name="small-only") == before + 3
