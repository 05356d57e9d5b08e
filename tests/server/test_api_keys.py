"""Per-user keys (--api-key-file) through a real server on the tiny model: limits, models, admin, usage, SIGHUP."""
from __future__ import annotations

import json
import signal
import threading

import httpx
import pytest

from hearth.entrypoints import cli
from tests.server.conftest import TINY_ARGS, start_server, wait_until

ADMIN = "sk-admin-test"
KEYS = {"alice": "sk-alice-1", "bob": "sk-bob-2", "carol": "sk-carol-3", "dave": "sk-dave-4", "erin": "sk-erin-5",
        "frank": "sk-frank-6"}
KEY_FILE = f"""
admin_key = "{ADMIN}"

[[keys]]
name = "alice"
key = "{KEYS['alice']}"
requests_per_minute = 2

[[keys]]
name = "bob"
key = "{KEYS['bob']}"
models = ["another-model"]

[[keys]]
name = "carol"
key = "{KEYS['carol']}"
max_concurrent_requests = 1

[[keys]]
name = "dave"
key = "{KEYS['dave']}"
tokens_per_day = 1

[[keys]]
name = "erin"
key = "{KEYS['erin']}"
models = ["tiny"]

[[keys]]
name = "frank"
key = "{KEYS['frank']}"
tokens_per_day = 50
"""


@pytest.fixture(scope="module")
def keyed(tiny_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "keys.toml"
    path.write_text(KEY_FILE)
    srv = start_server([tiny_model, *TINY_ARGS, "--api-key-file", str(path), "--answer-cache-size", "16"],
                       str(tmp_path_factory.mktemp("logs") / "keys.log"))
    srv.key_file = path
    yield srv
    srv.stop()


def complete(server, name: str, **body) -> httpx.Response:
    return httpx.post(server.url + "/v1/completions", timeout=30, headers={"authorization": f"Bearer {KEYS[name]}"},
                      json={"model": "tiny", "prompt": "Hello there", "max_tokens": 3, **body})


def error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    return r.json()["error"]


def test_keys_required_and_open_routes(keyed):
    assert error(httpx.post(keyed.url + "/v1/completions", json={"prompt": "x"}), 401)["code"] == "invalid_api_key"
    bad = httpx.get(keyed.url + "/v1/models", headers={"authorization": "Bearer sk-alice-"})
    assert error(bad, 401)["code"] == "invalid_api_key"
    assert httpx.get(keyed.url + "/status").status_code == 401
    assert httpx.get(keyed.url + "/health").status_code == 200
    page = httpx.get(keyed.url + "/")  # the page itself is open: it asks for the key
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert keyed.client(KEYS["alice"]).models.list().data[0].id == "tiny"
    status = httpx.get(keyed.url + "/status", headers={"authorization": f"Bearer {KEYS['alice']}"}).json()
    (model,) = status["models"]
    assert model["name"] == "tiny" and model["state"] == "loaded" and model["kv_cache_total_blocks"] > 0
    assert model["kv_cache_used_blocks"] == status["num_requests_running"] == 0


def test_requests_per_minute_429_on_the_third(keyed):
    assert complete(keyed, "alice").status_code == 200
    assert complete(keyed, "alice").status_code == 200
    third = complete(keyed, "alice")
    err = error(third, 429)
    assert "requests_per_minute = 2" in err["message"] and "alice" in err["message"]
    assert err["type"] == "rate_limit_error"
    assert 1 <= int(third.headers["retry-after"]) <= 60
    assert keyed.client(KEYS["alice"]).models.list().data  # listing models is not a counted request


def test_model_not_allowed_403(keyed):
    err = error(complete(keyed, "bob"), 403)
    assert err["code"] == "model_not_allowed" and err["param"] == "model"
    assert "'tiny'" in err["message"] and "another-model" in err["message"]
    assert error(complete(keyed, "bob", model=None), 403)["code"] == "model_not_allowed"
    # NOTE: refused where the route reaches the model (model_access), after the guard counted it against the key
    assert keyed.metric("hearth:key_requests_total", key_name="bob") == 2
    assert complete(keyed, "erin").status_code == 200  # allowed: the body reaches the app intact
    big = httpx.post(keyed.url + "/v1/completions", headers={"authorization": f"Bearer {KEYS['erin']}"},
                     content=(b"x" * 1000 for _ in range(300)), timeout=30)  # chunked: no content-length
    assert "larger than the limit" in error(big, 413)["message"]
    assert keyed.client(KEYS["bob"]).models.list().data == []  # a key's model list shows only its models
    assert [m.id for m in keyed.client(KEYS["erin"]).models.list().data] == ["tiny"]
    for path in ("/status", "/api/tags", "/api/ps"):  # every listing, not only /v1/models
        assert httpx.get(keyed.url + path, headers=_as("bob")).json()["models"] == []
        assert len(httpx.get(keyed.url + path, headers=_as("erin")).json()["models"]) == 1


def test_concurrent_requests_limit(keyed):
    # The first request is held in flight by its own body, which ends only when the test says so (a long answer
    # would race the second request on a fast model).
    release, result = threading.Event(), {}

    def body():
        yield b'{"model": "tiny", "prompt": "Hello", "max_tokens": 2'
        release.wait(30)
        yield b"}"

    def first() -> None:
        result["status"] = httpx.post(keyed.url + "/v1/completions", content=body(), timeout=60,
                                      headers={"authorization": f"Bearer {KEYS['carol']}"}).status_code

    t = threading.Thread(target=first)
    t.start()
    try:
        assert wait_until(lambda: usage(keyed, "carol")["in_flight"] == 1)
        err = error(complete(keyed, "carol"), 429)
        assert "max_concurrent_requests = 1" in err["message"]
    finally:
        release.set()
        t.join(60)
    assert result["status"] == 200
    assert wait_until(lambda: usage(keyed, "carol")["in_flight"] == 0)
    assert complete(keyed, "carol").status_code == 200  # the finished request gave its slot back


def usage(server, name: str) -> dict:
    r = httpx.get(server.url + "/keys/usage", headers={"authorization": f"Bearer {ADMIN}"})
    return next(row for row in r.json()["data"] if row["name"] == name)["usage"]


def test_tokens_per_day(keyed):
    r = complete(keyed, "dave")  # it could use more than the whole quota: refused before it runs
    assert "tokens_per_day = 1" in error(r, 429)["message"]
    assert 1 <= int(r.headers["retry-after"]) <= 86400


def _frank_usage(keyed) -> dict:
    rows = httpx.get(keyed.url + "/keys/usage", headers={"authorization": f"Bearer {ADMIN}"}).json()["data"]
    return next(row["usage"] for row in rows if row["name"] == "frank")


def test_token_quota_is_reserved_before_a_request_runs(keyed):
    # Issue 44: one request of 32 prompts x 64 tokens used 2 080 tokens of a 50-token quota.
    r = complete(keyed, "frank", prompt=["Hello there"] * 32, max_tokens=64, ignore_eos=True)
    err = error(r, 429)
    assert "tokens_per_day = 50" in err["message"] and err["type"] == "rate_limit_error"
    assert _frank_usage(keyed)["tokens_today"] == 0  # nothing ran, nothing held
    used = []
    for _ in range(10):  # bounded: each allowed request uses at least 8 tokens
        r = complete(keyed, "frank", max_tokens=5, ignore_eos=True)
        if r.status_code != 200:
            assert r.status_code == 429
            break
        used.append(r.json()["usage"]["total_tokens"])
    usage = _frank_usage(keyed)
    assert used and usage["tokens_today"] == sum(used) <= 50  # never past the quota
    assert usage["tokens_reserved"] == 0  # what finished requests did not use went back


def test_usage_metrics_and_cli(keyed, capsys):
    before = {k: keyed.metric("hearth:key_tokens_total", key_name="erin", kind=k) for k in ("prompt", "completion")}
    requests_before = keyed.metric("hearth:key_requests_total", key_name="erin")
    client = keyed.client(KEYS["erin"])
    a = client.completions.create(model="tiny", prompt="One two three", max_tokens=4,
                                  extra_body={"ignore_eos": True})
    chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=5, stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    b = chunks[-1].usage
    assert keyed.metric("hearth:key_requests_total", key_name="erin") == requests_before + 2
    assert keyed.metric("hearth:key_tokens_total", key_name="erin", kind="prompt") - before["prompt"] == \
        a.usage.prompt_tokens + b.prompt_tokens
    assert keyed.metric("hearth:key_tokens_total", key_name="erin", kind="completion") - before["completion"] == \
        a.usage.completion_tokens + b.completion_tokens == 9

    # the admin route and `hearth keys usage`: names and counts, never a key
    r = httpx.get(keyed.url + "/keys/usage", headers={"authorization": f"Bearer {KEYS['erin']}"})
    assert error(r, 403)["code"] == "admin_key_required"
    r = httpx.get(keyed.url + "/keys/usage", headers={"authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200 and "sk-" not in r.text
    erin = next(row for row in r.json()["data"] if row["name"] == "erin")
    assert erin["usage"]["requests"] == requests_before + 2 and erin["limits"]["models"] == ["tiny"]
    assert cli.main(["keys", "usage", "--url", keyed.url, "--api-key", ADMIN]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:2] == ["NAME", "REQUESTS"]
    assert next(line for line in table if line.startswith("erin")).split()[1] == str(erin["usage"]["requests"])
    assert cli.main(["keys", "usage", "--url", keyed.url, "--api-key", KEYS["erin"]]) == 2
    assert "admin key" in capsys.readouterr().err
    assert not any(k in keyed.read_log() for k in [ADMIN, *KEYS.values()])  # keys never logged


def test_sighup_reloads_the_key_file(keyed):
    frank = "sk-frank-6"
    keyed.key_file.write_text(KEY_FILE + f'\n[[keys]]\nname = "frank"\nkey = "{frank}"\n')
    keyed.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: httpx.get(keyed.url + "/v1/models",
                                        headers={"authorization": f"Bearer {frank}"}).status_code == 200)
    r = httpx.get(keyed.url + "/keys/usage", headers={"authorization": f"Bearer {ADMIN}"})
    alice = next(row for row in r.json()["data"] if row["name"] == "alice")
    assert alice["usage"]["requests"] == 2  # usage survives the reload
    keyed.key_file.write_text("this is [not toml")  # a broken file keeps the keys in force
    keyed.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: "keeping the current API keys" in keyed.read_log())
    assert httpx.get(keyed.url + "/v1/models", headers={"authorization": f"Bearer {frank}"}).status_code == 200
    assert json.loads(httpx.get(keyed.url + "/health").text)["status"] == "ok"


DEEP = '{"model": "tiny", "prompt": "x", "max_tokens": 2, "messages": ' + "[" * 5000 + "]" * 5000 + "}"


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/v1/messages", "/api/chat"])
@pytest.mark.parametrize("name", ["erin", "carol"])  # with a model list (read by the key check) and without
def test_deep_json_is_a_400_in_the_routes_shape_for_every_key(keyed, path, name):
    # Issue 44: only for a key with a model list, the key check's own json.loads raised RecursionError (a 500
    # and a dropped connection); the body's one reader now answers it the same way on every path.
    with httpx.Client(base_url=keyed.url, timeout=30, headers={"authorization": f"Bearer {KEYS[name]}",
                                                               "content-type": "application/json"}) as c:
        r = c.post(path, content=DEEP.encode())
        assert r.status_code == 400, r.text
        body = r.json()
        if path == "/v1/messages":
            assert body["type"] == "error" and "64 levels" in body["error"]["message"]
        elif path.startswith("/api/"):
            assert "64 levels" in body["error"]
        else:
            assert body["error"]["param"] == "messages" and "64 levels" in body["error"]["message"]
        assert c.get("/v1/models").status_code == 200  # the same connection goes on


def _as(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[name]}"}


def test_stored_responses_belong_to_the_key_that_made_them(keyed):
    # Issue 44: any key could read, continue and delete another key's stored response.
    with httpx.Client(base_url=keyed.url, timeout=60) as c:
        r = c.post("/v1/responses", headers=_as("erin"), json={"model": "tiny", "input": "secret plans",
                                                                "max_output_tokens": 3})
        assert r.status_code == 200, r.text
        rid = r.json()["id"]
        for attempt in (c.get(f"/v1/responses/{rid}", headers=_as("carol")),
                        c.post("/v1/responses", headers=_as("carol"), json={
                            "model": "tiny", "input": "and then?", "previous_response_id": rid,
                            "max_output_tokens": 2}),
                        c.delete(f"/v1/responses/{rid}", headers=_as("carol"))):
            assert error(attempt, 404)["code"] == "response_not_found"  # as for an id that does not exist
        assert c.get(f"/v1/responses/{rid}", headers=_as("erin")).json()["id"] == rid  # still there, for erin
        assert c.delete(f"/v1/responses/{rid}", headers=_as("erin")).json()["deleted"] is True


def test_cached_answers_are_per_key(keyed):
    body = {"model": "tiny", "prompt": "the secret question", "max_tokens": 3, "temperature": 0}
    with httpx.Client(base_url=keyed.url, timeout=60) as c:
        first = c.post("/v1/completions", headers=_as("erin"), json=body)
        again = c.post("/v1/completions", headers=_as("erin"), json=body)
        other = c.post("/v1/completions", headers=_as("carol"), json=body)
    assert first.headers["x-hearth-route"] == "local" and again.headers["x-hearth-route"] == "cache"
    assert other.status_code == 200 and other.headers["x-hearth-route"] == "local"  # not erin's answer
    assert other.json()["id"] != first.json()["id"]
