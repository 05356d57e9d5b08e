"""body.aloads: a large body is parsed in a parser thread, with the same depth limit and errors as loads."""
from __future__ import annotations

import asyncio
import json
import threading

import pytest

from hearth.entrypoints.openai import body
from hearth.entrypoints.openai.errors import APIError


def test_large_bodies_parse_in_a_parser_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    threads = []
    real = body.parse_json

    def spy(data: bytes, max_depth: int = body.MAX_JSON_DEPTH) -> object:
        threads.append(threading.current_thread().name)
        return real(data, max_depth)

    monkeypatch.setattr(body, "parse_json", spy)
    small = json.dumps({"a": 1}).encode()
    large = json.dumps({"a": "x" * body.OFF_LOOP_BYTES}).encode()
    assert asyncio.run(body.aloads(small)) == {"a": 1}
    assert asyncio.run(body.aloads(large))["a"] == "x" * body.OFF_LOOP_BYTES
    assert threads[0] == threading.current_thread().name and threads[1].startswith("hearth-json")


def test_the_depth_limit_holds_off_the_loop() -> None:
    deep = b'{"pad": "' + b"x" * body.OFF_LOOP_BYTES + b'", "tools": ' + b"[" * 100 + b"]" * 100 + b"}"
    with pytest.raises(APIError) as e:
        asyncio.run(body.aloads(deep))
    assert e.value.status == 400 and e.value.param == "tools" and "64 levels" in e.value.message
