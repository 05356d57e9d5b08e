"""Gateway flags: bad values are one-line CLI errors; the blocklist file is read once, at start-up."""
from __future__ import annotations

import argparse

import pytest
from prometheus_client import CollectorRegistry

from hearth.entrypoints.openai.answer_cache import AnswerCache, cache_key, repeatable
from hearth.entrypoints.openai.gateway import add_gateway_args, gateway_config_from


def _ns(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_gateway_args(p)
    return p.parse_args(list(argv))


def test_config_from_flags(tmp_path) -> None:
    blocklist = tmp_path / "b.txt"
    blocklist.write_text("# comment\n\nbad\\s+word\n")
    c = gateway_config_from(_ns("--upstream", "http://gpu:8000/v1/", "--blocklist", str(blocklist),
                                "--upstream-min-prompt-tokens", "100"), "env-key")
    assert c.upstream == "http://gpu:8000" and c.upstream_api_key == "env-key" and c.enabled
    assert [p.pattern for p in c.blocklist] == ["bad\\s+word"] and c.blocklist[0].search("BAD  WORD")
    assert not gateway_config_from(_ns(), None).enabled


@pytest.mark.parametrize("argv, message", [
    (["--upstream", "gpu:8000"], "--upstream must be an http"),
    (["--upstream-min-prompt-tokens", "10"], "need --upstream"),
    (["--answer-cache-size", "-1"], "--answer-cache-size must be >= 0"),
    (["--answer-cache-ttl", "0"], "--answer-cache-ttl must be > 0"),
])
def test_bad_flags(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        gateway_config_from(_ns(*argv), None)


def test_bad_blocklist_names_the_line(tmp_path) -> None:
    f = tmp_path / "b.txt"
    f.write_text("fine\n(unclosed\n")
    with pytest.raises(ValueError, match=r"b.txt:2: not a regular expression"):
        gateway_config_from(_ns("--blocklist", str(f)), None)


def test_cache_key_and_lru() -> None:
    assert repeatable({"temperature": 0}) and repeatable({"seed": 3}) and not repeatable({"temperature": 0.7})
    body = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    assert cache_key("/v1/chat/completions", "m", body, None) == cache_key("/v1/chat/completions", "m",
                                                                           dict(reversed(body.items())), None)
    assert cache_key("/v1/chat/completions", "m", body, None) != cache_key("/v1/chat/completions", "m",
                                                                           {**body, "max_tokens": 3}, None)
    assert cache_key("/v1/chat/completions", "m", body, None) != cache_key("/v1/completions", "m", body, None)
    # per API key: one key's hit never answers (or reveals) another key's question
    assert cache_key("/v1/chat/completions", "m", body, "a") != cache_key("/v1/chat/completions", "m", body, "b")
    registry = CollectorRegistry()
    cache = AnswerCache(2, 60, registry)
    for k in "abc":
        cache.put(k, k.encode(), "application/json")
    assert cache.get("a") is None and cache.get("c").body == b"c"  # LRU: the oldest went first
    assert registry.get_sample_value("hearth:answer_cache_hits_total") == 1
    assert registry.get_sample_value("hearth:answer_cache_queries_total") == 2
