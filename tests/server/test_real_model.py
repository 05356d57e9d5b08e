"""End to end on the bundled SmolLM2-135M-Instruct, where the answers matter."""
from __future__ import annotations

import httpx
import pytest

from tests.server.conftest import start_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    log = str(tmp_path_factory.mktemp("logs") / "smol.log")
    try:
        srv = start_server(["--max-model-len", "1024", "--kv-cache-space", "0.25", "--threads", "1"], log)
    except RuntimeError as e:
        if "ImportError" in str(e) or "ModuleNotFoundError" in str(e):
            pytest.skip(f"the GGUF loader is not available yet: {str(e).splitlines()[-1]}")
        raise
    yield srv
    srv.stop()


CAPITAL = [{"role": "system", "content": "You are a helpful assistant."},
           {"role": "user", "content": "What is the capital of France?"}]


def test_chat_answers(smol):
    client = smol.client()
    name = client.models.list().data[0].id
    r = client.chat.completions.create(model=name, messages=CAPITAL, temperature=0, max_tokens=30)
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"  # the model ends its turn: EOS is hidden from the text
    assert "<|im_end|>" not in r.choices[0].message.content
    chunks = list(client.chat.completions.create(model=name, messages=CAPITAL, temperature=0, max_tokens=30,
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens


def test_chat_stop_string(smol):
    client = smol.client()
    r = client.chat.completions.create(model=client.models.list().data[0].id, messages=CAPITAL, temperature=0,
                                       max_tokens=30, stop=["Paris"])
    assert r.choices[0].finish_reason == "stop" and "Paris" not in r.choices[0].message.content
    assert r.choices[0].model_extra.get("stop_reason") == "Paris"


def test_seeded_sampling_reproducible_and_n(smol):
    client = smol.client()
    kw = {"model": client.models.list().data[0].id, "temperature": 0.9, "max_tokens": 10, "seed": 7,
          "messages": [{"role": "user", "content": "Write a short poem."}]}
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert a.choices[0].message.content == b.choices[0].message.content
    two = client.chat.completions.create(n=2, **kw)
    assert len(two.choices) == 2 and two.choices[0].message.content != two.choices[1].message.content


def test_completions_echo_logprobs(smol):
    client = smol.client()
    name = client.models.list().data[0].id
    prompt = "The capital of France is"
    n_prompt = httpx.post(smol.url + "/tokenize", json={"prompt": prompt}).json()["count"]
    r = client.completions.create(model=name, prompt=prompt, max_tokens=3, temperature=0, echo=True, logprobs=2)
    c = r.choices[0]
    assert c.text.startswith(prompt) and "Paris" in c.text
    assert len(c.logprobs.tokens) == n_prompt + 3 == r.usage.prompt_tokens + r.usage.completion_tokens
    assert c.logprobs.token_logprobs[0] is None
    # the greedy token is the top alternative
    for tok, lp, top in list(zip(c.logprobs.tokens, c.logprobs.token_logprobs, c.logprobs.top_logprobs))[n_prompt:]:
        assert abs(max(top.values()) - lp) < 1e-4 and tok in top


def test_chat_logprobs(smol):
    client = smol.client()
    r = client.chat.completions.create(model=client.models.list().data[0].id, messages=CAPITAL, temperature=0,
                                       max_tokens=8, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token and abs(entry.top_logprobs[0].logprob - entry.logprob) < 1e-4
