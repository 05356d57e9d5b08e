"""Endpoint mechanics on a tiny random checkpoint: shapes, usage counts, streaming, n, logprobs, echo, stop, seed."""
from __future__ import annotations

import httpx

GREEDY = {"temperature": 0.0}
IGNORE_EOS = {"ignore_eos": True}  # random weights: without this a request may stop at any length


def n_tokens(server, text: str) -> int:
    return httpx.post(server.url + "/tokenize", json={"prompt": text}, timeout=10).json()["count"]


def test_models_health_version(server, client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert models.data[0].max_model_len == 256
    assert server.health()["status"] == "ok"
    assert httpx.get(server.url + "/version").json()["version"]


def test_completion_usage_exact(server, client):
    prompt = "The quick brown fox"
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=7, extra_body=IGNORE_EOS, **GREEDY)
    assert r.object == "text_completion" and len(r.choices) == 1
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == n_tokens(server, prompt)
    assert r.usage.completion_tokens == 7
    assert r.usage.total_tokens == r.usage.prompt_tokens + 7


def test_completion_stream_matches_non_stream(client):
    kw = dict(model="tiny", prompt="Paris is the capital", max_tokens=12, extra_body=IGNORE_EOS, **GREEDY)
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_completion_prompt_forms_and_n(server, client):
    ids = httpx.post(server.url + "/tokenize", json={"prompt": "hearth serves"}).json()["tokens"]
    for prompt, count in [(["The quick", "lazy dog"], 2), (ids, 1), ([ids, ids[:1]], 2)]:
        r = client.completions.create(model="tiny", prompt=prompt, n=2, max_tokens=3, extra_body=IGNORE_EOS)
        assert sorted(c.index for c in r.choices) == list(range(2 * count))
        assert r.usage.completion_tokens == 3 * 2 * count


def test_completion_logprobs(client):
    r = client.completions.create(model="tiny", prompt="The quick", max_tokens=5, logprobs=3, extra_body=IGNORE_EOS)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert all(v <= 0 for v in lp.token_logprobs)
    # NOTE: the legacy format keys alternatives by text, and byte tokens of a random model collide (all "\ufffd")
    assert all(1 <= len(top) <= 4 for top in lp.top_logprobs)


def test_echo_with_prompt_logprobs(server, client):
    prompt = "The quick brown"
    n_prompt = n_tokens(server, prompt)
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=4, echo=True, logprobs=1,
                                  extra_body=IGNORE_EOS, **GREEDY)
    c = r.choices[0]
    assert c.text.startswith(prompt)
    assert len(c.logprobs.tokens) == n_prompt + 4
    assert c.logprobs.token_logprobs[0] is None
    assert all(v is not None for v in c.logprobs.token_logprobs[1:])
    plain = client.completions.create(model="tiny", prompt=prompt, max_tokens=4, extra_body=IGNORE_EOS, **GREEDY)
    assert c.text == prompt + plain.choices[0].text
    # streaming echo: the prompt comes first
    chunks = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=4, echo=True, stream=True,
                                            extra_body=IGNORE_EOS, **GREEDY))
    assert "".join(ch.choices[0].text for ch in chunks) == c.text


def test_seed_reproducible(client):
    kw = {"model": "tiny", "prompt": "The lazy dog", "max_tokens": 16, "temperature": 1.0, "extra_body": IGNORE_EOS}
    a = client.completions.create(seed=1234, **kw).choices[0].text
    b = client.completions.create(seed=1234, **kw).choices[0].text
    assert a == b
    texts = {client.completions.create(seed=s, **kw).choices[0].text for s in range(4)}
    assert len(texts) > 1


def test_stop_string(client):
    kw = dict(model="tiny", prompt="The quick brown fox", max_tokens=40, extra_body=IGNORE_EOS, **GREEDY)
    full = client.completions.create(**kw).choices[0].text
    # a stop string from the middle of the greedy text: the answer is cut right before its first occurrence
    start = len(full) // 2
    stop = full[start:start + 2]
    assert stop.strip(), f"unlucky greedy text {full!r}"
    r = client.completions.create(stop=[stop], **kw)
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == full[:full.find(stop)]


def test_chat_non_stream_and_stream(server, client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, extra_body=IGNORE_EOS,
                                       **GREEDY)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    prompt = httpx.post(server.url + "/tokenize", json={"messages": messages}).json()["count"]
    assert r.usage.prompt_tokens == prompt and r.usage.completion_tokens == 6
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, stream=True,
                                                 stream_options={"include_usage": True}, extra_body=IGNORE_EOS,
                                                 **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 6 and chunks[-1].usage.prompt_tokens == prompt


def test_chat_n2_stream(client):
    chunks = list(client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Tell me"}], n=2, max_completion_tokens=5, stream=True,
        stream_options={"include_usage": True}, extra_body=IGNORE_EOS))
    finished = {c.choices[0].index: c.choices[0].finish_reason for c in chunks
                if c.choices and c.choices[0].finish_reason}
    assert finished == {0: "length", 1: "length"}
    assert chunks[-1].usage.completion_tokens == 10


def test_chat_logprobs_and_sampling_fields(client):
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hello"}], max_tokens=4, logprobs=True, top_logprobs=2,
        temperature=0.7, top_p=0.9, seed=3, presence_penalty=0.5, frequency_penalty=0.5, logit_bias={"5": 1.0},
        extra_body={"top_k": 20, "min_p": 0.01, "repetition_penalty": 1.1, "min_tokens": 2, "ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 4
    assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in content)


def test_chat_content_parts_and_no_generation_prompt(server, client):
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": [
        {"type": "text", "text": "Hello"}, {"type": "text", "text": "again"}]}], max_tokens=2)
    assert r.choices[0].message.content is not None
    with_prompt = httpx.post(server.url + "/tokenize", json={"messages": [{"role": "user", "content": "x"}]}).json()
    without = httpx.post(server.url + "/tokenize", json={"messages": [{"role": "user", "content": "x"}],
                                                         "add_generation_prompt": False}).json()
    assert with_prompt["count"] > without["count"]


def test_tokenize_detokenize_roundtrip(server):
    tok = httpx.post(server.url + "/tokenize", json={"prompt": "The quick brown fox", "add_special_tokens": False})
    ids = tok.json()["tokens"]
    assert tok.json()["count"] == len(ids) and tok.json()["max_model_len"] == 256
    back = httpx.post(server.url + "/detokenize", json={"tokens": ids}).json()
    assert back["prompt"] == "The quick brown fox"
