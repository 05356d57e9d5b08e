"""Ollama's API with the `ollama` client on the tiny random checkpoint: listings, NDJSON streams, options, format,
tools, errors in Ollama's shape. The bundled model's answers are in test_ollama_real.py."""
from __future__ import annotations

import json

import httpx
import jsonschema
import ollama
import pytest

from tests.server.test_structured import PERSON

FIXED = {"temperature": 0, "num_predict": 6}


def oc(server) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=120)


def test_listings_and_version(server):
    c = oc(server)
    models = c.list().models
    assert [m.model for m in models] == ["tiny:latest"] and models[0].size > 0 and models[0].digest
    assert models[0].details.format == "safetensors" and models[0].details.family == "llama"
    assert [m.model for m in c.ps().models] == ["tiny:latest"]
    shown = c.show("tiny")
    assert "completion" in shown.capabilities and shown.modelinfo["llama.context_length"] == 256
    assert httpx.get(server.url + "/api/version").json()["version"]
    with pytest.raises(ollama.ResponseError, match="never downloads") as e:
        c.pull("llama3")
    assert e.value.status_code == 400
    with pytest.raises(ollama.ResponseError, match="not found") as e:
        c.chat(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 404


def test_chat_whole_and_streamed(server):
    c = oc(server)
    kw = dict(model="tiny", messages=[{"role": "user", "content": "The quick brown fox"}], options=FIXED)
    r = c.chat(**kw)
    assert r.done and r.message.role == "assistant" and r.eval_count <= 6 and r.prompt_eval_count > 0
    parts = list(c.chat(stream=True, **kw))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done and parts[-1].done_reason == r.done_reason
    assert "".join(p.message.content for p in parts) == r.message.content
    assert parts[-1].eval_count == r.eval_count and parts[-1].total_duration > 0


def test_generate_raw_templated_and_context(server):
    c = oc(server)
    opts = {**FIXED, "num_predict": 5}
    raw = c.generate(model="tiny", prompt="The quick brown fox", raw=True, options=opts)
    n_prompt = httpx.post(server.url + "/tokenize", json={"prompt": "The quick brown fox"}).json()["count"]
    assert raw.prompt_eval_count == n_prompt and len(raw.context) == n_prompt + raw.eval_count
    streamed = list(c.generate(model="tiny", prompt="The quick brown fox", raw=True, options=opts, stream=True))
    assert "".join(p.response for p in streamed) == raw.response and streamed[-1].context == raw.context
    templated = c.generate(model="tiny", prompt="The quick brown fox", system="Be brief.", options=opts)
    assert templated.prompt_eval_count > n_prompt  # the chat template wrapped it
    assert c.generate(model="tiny", prompt="").done_reason == "load"


def test_options_map_to_sampling(server):
    c = oc(server)
    msgs = [{"role": "user", "content": "Paris is"}]
    # NOTE: top_p off: on this random model's flat distributions a prefix-cache hit's last-bit logit differences
    # move the top-p cut (Ollama's default top_p 0.9), so the same seed need not give the same text there.
    opts = {"seed": 11, "temperature": 1.0, "num_predict": 8, "top_k": 50, "top_p": 1.0}
    a = c.chat(model="tiny", messages=msgs, options=opts)
    b = c.chat(model="tiny", messages=msgs, options=opts)
    assert a.message.content == b.message.content and a.eval_count == 8
    stopped = c.generate(model="tiny", prompt="The quick brown fox", raw=True,
                         options={"temperature": 0, "num_predict": 20, "stop": ["o"]})
    assert "o" not in stopped.response and stopped.done_reason == "stop"
    r = httpx.post(server.url + "/api/chat", json={"model": "tiny", "messages": msgs, "stream": False,
                                                   "options": {"temperature": -3}}, timeout=30)
    assert r.status_code == 400 and "temperature" in r.json()["error"]


def test_format_json_and_schema(server):
    c = oc(server)
    for seed in range(2):
        r = c.chat(model="tiny", messages=[{"role": "user", "content": "A person."}], format=PERSON,
                   options={"seed": seed, "num_predict": 120})
        jsonschema.validate(json.loads(r.message.content), PERSON)
    g = c.generate(model="tiny", prompt="A person:", raw=True, format="json", options={"seed": 1, "num_predict": 60})
    if g.done_reason == "stop":  # (a cut-short object is not complete JSON)
        assert isinstance(json.loads(g.response), dict)


def test_stream_lines_are_ndjson(server):
    with httpx.stream("POST", server.url + "/api/generate", timeout=30,
                      json={"model": "tiny", "prompt": "The quick", "raw": True, "options": FIXED}) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert lines[-1]["done"] is True and all(line["done"] is False for line in lines[:-1])
