"""Every error class: its status and the OpenAI-style body. User input never produces a 500."""
from __future__ import annotations

import json
import signal
import threading

import httpx
import openai
import pytest

from tests.server.conftest import TINY_ARGS, start_server


def post(server, path: str, body, headers: dict | None = None) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(server.url + path, content=content, headers={"content-type": "application/json",
                                                                   **(headers or {})}, timeout=30)


def assert_error(r: httpx.Response, status: int, param: str | None = "ANY") -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param != "ANY":
        assert err["param"] == param, err
    return err


@pytest.mark.parametrize("body,param", [
    ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "temperature": -0.5}, "temperature"),
    ({"prompt": "x", "top_p": 1.5}, "top_p"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "presence_penalty": 3}, "presence_penalty"),
    ({"prompt": "x", "logprobs": 50}, "logprobs"),
    ({"prompt": "x", "max_tokens": "many"}, "max_tokens"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": 12}, "prompt"),
    ({"prompt": "x", "stop": 5}, "stop"),
    ({"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias"),
    ({"prompt": "x", "seed": 2**64}, "seed"),
    ({"prompt": "x", "temperature": float("nan")}, "temperature"),
    ({"prompt": "x", "logit_bias": {"99999": 1}}, "logit_bias"),
    ({"prompt": "x", "stop_token_ids": [99999]}, "stop_token_ids"),
    ({"prompt": "x", "min_tokens": 10**9, "max_tokens": None}, "min_tokens"),
    ({"prompt": [99999]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": "x", "suffix": "tail"}, "suffix"),
    ({"prompt": "x", "best_of": 3}, "best_of"),
    ({"max_tokens": 3}, "prompt"),
])
def test_completions_400(server, body, param):
    assert_error(post(server, "/v1/completions", body), 400, param)


@pytest.mark.parametrize("body,param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, None),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -3}, "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "chat_template": "{% for %}"}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
    ({"messages": "hello"}, "messages"),
])
def test_chat_400(server, body, param):
    err = assert_error(post(server, "/v1/chat/completions", body), 400)
    if param is not None:
        assert err["param"] == param or (err["param"] or "").startswith(param), err


def test_malformed_json_and_non_object(server):
    for raw in [b"{bad json", b"[1, 2]", b"", "\"text\"", b"\xff\xfe"]:
        assert_error(post(server, "/v1/completions", raw), 400)
        assert_error(post(server, "/v1/chat/completions", raw), 400)


def test_too_long_names_both_numbers(server):
    err = assert_error(post(server, "/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 253}), 400)
    assert "256" in err["message"] and "253" in err["message"] and err["param"] == "max_tokens"
    long_prompt = "The quick brown fox jumps over the lazy dog. " * 60
    err = assert_error(post(server, "/v1/completions", {"prompt": long_prompt}), 400)
    assert "256" in err["message"]


def test_unknown_model_404(server, client):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-9", prompt="x", max_tokens=1)
    assert e.value.status_code == 404
    err = assert_error(post(server, "/v1/chat/completions", {"model": "gpt-9", "messages": [
        {"role": "user", "content": "x"}]}), 404, "model")
    assert err["code"] == "model_not_found"


def test_openai_client_raises_bad_request(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], temperature=-1)
    assert e.value.body["param"] == "temperature"


def test_body_over_limit_413(server):
    assert_error(post(server, "/v1/completions", {"prompt": "x" * 300_000}), 413)

    def chunks():  # no content-length: counted as it arrives
        yield b'{"prompt": "'
        for _ in range(30):
            yield b"x" * 10_000
        yield b'"}'
    r = httpx.post(server.url + "/v1/completions", content=chunks(), timeout=30)
    assert_error(r, 413)


def test_unknown_fields_are_ignored(server):
    r = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 1, "some_future_field": {"a": 1}})
    assert r.status_code == 200


# ---- a second server: API key, one sequence slot, no waiting room ----
KEY = "sk-test-123"


@pytest.fixture(scope="module")
def guarded(tiny_model, tmp_path_factory):
    srv = start_server([tiny_model, *TINY_ARGS, "--max-num-seqs", "1", "--max-waiting-requests", "0"],
                       str(tmp_path_factory.mktemp("logs") / "guarded.log"), env={"HEARTH_API_KEY": KEY})
    yield srv
    srv.stop()


def test_api_key_401(guarded):
    for headers in [{}, {"authorization": "Bearer wrong"}, {"authorization": KEY}]:
        err = assert_error(post(guarded, "/v1/completions", {"prompt": "x"}, headers), 401)
        assert err["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        guarded.client("wrong").models.list()
    assert guarded.client(KEY).models.list().data[0].id == "tiny"
    assert httpx.get(guarded.url + "/health").status_code == 200  # probes need no key
    assert httpx.get(guarded.url + "/metrics").status_code == 200


def _long_stream(server, seen_first: threading.Event, result: dict) -> None:
    body = {"prompt": "The quick", "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60,
                      headers={"authorization": f"Bearer {KEY}"}) as r:
        lines = []
        for line in r.iter_lines():
            if line:
                lines.append(line)
                seen_first.set()
        result["lines"] = lines
        result["status"] = r.status_code


def test_queue_full_503_with_retry_after(guarded):
    # NOTE: the tiny model can finish its 200 tokens before the second request lands (a loaded machine stalls the
    # client, not only the server); a 200 then means the slot was already free, so try again, a bounded few times.
    for _ in range(5):
        seen_first, result = threading.Event(), {}
        t = threading.Thread(target=_long_stream, args=(guarded, seen_first, result))
        t.start()
        try:
            assert seen_first.wait(30)
            r = post(guarded, "/v1/completions", {"prompt": "x", "max_tokens": 2}, {"authorization": f"Bearer {KEY}"})
        finally:
            t.join(60)
        assert result["status"] == 200 and result["lines"][-1] == "data: [DONE]"
        if r.status_code != 200:
            break
    err = assert_error(r, 503)
    assert int(r.headers["retry-after"]) >= 1 and "waiting" in err["message"]
    # once the slot is free, requests go through again
    r = post(guarded, "/v1/completions", {"prompt": "x", "max_tokens": 2}, {"authorization": f"Bearer {KEY}"})
    assert r.status_code == 200


def test_sigterm_drains_in_flight_then_exits(guarded):
    """Last test of the module: it stops the guarded server."""
    seen_first, result = threading.Event(), {}
    t = threading.Thread(target=_long_stream, args=(guarded, seen_first, result))
    t.start()
    assert seen_first.wait(30)
    guarded.proc.send_signal(signal.SIGTERM)
    t.join(60)
    assert result["status"] == 200 and result["lines"][-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in result["lines"][:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert guarded.proc.wait(30) == 0  # hearth's uvicorn Server does not re-raise the signal it handled
