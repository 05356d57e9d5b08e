"""upstream_check: what counts as a valid upstream answer (the gateway's server tests drive it end to end)."""
from __future__ import annotations

import pytest

from hearth.entrypoints.openai.upstream_check import (
    EventStream,
    UpstreamAnswerError,
    check_answer,
    passes_through,
)

CHUNK = b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}'


def test_events_split_anywhere_crlf_comments_and_done() -> None:
    text = b": keep-alive\r\n\r\n" + CHUNK + b"\r\n\r\n" + CHUNK + b"\n\ndata: [DONE]\n\ndata: ignored after done\n\n"
    events = EventStream()
    out = [e for i in range(len(text)) for e in events.feed(text[i:i + 1])]  # one byte at a time
    assert out[1:] == [CHUNK + b"\n\n", CHUNK + b"\n\n", b"data: [DONE]\n\n"] and events.done
    events.finish()


def test_error_event_passes_with_error_first() -> None:
    out = list(EventStream().feed(b'data: {"object": "error", "error": {"message": "m"}}\n\n'))
    assert out == [b'data: {"error":{"message":"m"},"object":"error"}\n\n']


@pytest.mark.parametrize("text", [b"data: not json\n\n", b"data: [1]\n\n", b'data: {"id": "no choices"}\n\n'])
def test_bad_events(text: bytes) -> None:
    with pytest.raises(UpstreamAnswerError, match="not a completion chunk"):
        list(EventStream().feed(CHUNK + b"\n\n" + text))


def test_stream_without_done() -> None:
    events = EventStream()
    list(events.feed(CHUNK + b"\n\n"))
    with pytest.raises(UpstreamAnswerError, match=r"without data: \[DONE\]"):
        events.finish()


def test_whole_answers() -> None:
    check_answer(200, b'{"choices": []}', "application/json", stream=False)
    for status, body, stream, words in ((200, b"<html>", False, "not a JSON object: <html>"),
                                        (200, b"{}", False, "no \"choices\""),
                                        (200, b'{"choices": []}', True, "not an event stream"),
                                        (503, b"<h1>Service Unavailable</h1>", False, "503: Service Unavailable"),
                                        (500, b'{"error": {"message": "boom"}}', False, "500: boom")):
        with pytest.raises(UpstreamAnswerError, match=words):
            check_answer(status, body, "application/json", stream)
    assert passes_through(404, b'{"error": {"message": "no such model"}}')
    assert not passes_through(401, b'{"error": {"message": "bad upstream key"}}')
    assert not passes_through(404, b"<html>not found</html>")
    assert not passes_through(500, b'{"error": {"message": "boom"}}')
