"""Checking an upstream's answer before the gateway passes it on or caches it: a non-2xx status, a body that is not
a completion, or an event stream with a broken event or no closing `data: [DONE]` is the upstream's failure, which
the client sees as a 502 (or, mid-stream, an error event), never as the upstream's bytes.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

MAX_EVENT_BYTES = 16 << 20  # an upstream that never ends an event cannot grow the buffer without bound
_EVENT_END = re.compile(rb"\r?\n\r?\n")
_LINE_END = re.compile(rb"\r?\n")
_TAG = re.compile(r"<[^>]*>")
_SNIPPET = 200  # characters of an upstream's broken body quoted in the error message
# 4xx statuses that are about the upstream's own credentials, not the client's request: the gateway's failure.
_UPSTREAM_AUTH = (401, 403)


class UpstreamAnswerError(ValueError):
    """The upstream answered, but with something that is not a valid answer (the message says what)."""


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError):  # (UnicodeDecodeError is a ValueError)
        return None


def _snippet(data: bytes) -> str:
    """The start of a body's text, HTML tags dropped (an error page's words are what tell the operator why)."""
    raw = data.decode("utf-8", "replace")
    text = " ".join(_TAG.sub(" ", raw).split()) or " ".join(raw.split())
    return text[:_SNIPPET] + ("..." if len(text) > _SNIPPET else "") if text else "(empty body)"


def upstream_message(data: bytes) -> str:
    """The upstream's own error message when its body has OpenAI's error shape, else the start of its text."""
    obj = _json(data)
    error = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    return _snippet(data)


def passes_through(status: int, data: bytes) -> bool:
    """An upstream 4xx in OpenAI's error shape is about the client's request (a model the upstream lacks, a prompt
    too long for it): the client gets it as it is. Its 401/403 are about the gateway's upstream key: not passed."""
    if not 400 <= status < 500 or status in _UPSTREAM_AUTH:
        return False
    obj = _json(data)
    return isinstance(obj, dict) and isinstance(obj.get("error"), dict) and isinstance(obj["error"].get("message"),
                                                                                       str)


def check_answer(status: int, data: bytes, media_type: str, stream: bool) -> None:
    """Raise UpstreamAnswerError unless this whole (not streamed) upstream answer is a 2xx completion object."""
    if not 200 <= status < 300:
        raise UpstreamAnswerError(f"answered {status}: {upstream_message(data)}")
    if stream:
        raise UpstreamAnswerError(f"answered a streamed request with {media_type or 'no content type'}, "
                                  "not an event stream")
    obj = _json(data)
    if not isinstance(obj, dict):
        raise UpstreamAnswerError(f"answered {status} with a body that is not a JSON object: {_snippet(data)}")
    if not isinstance(obj.get("choices"), list):
        raise UpstreamAnswerError(f"answered {status} with JSON that is not a completion (no \"choices\" list)")


class EventStream:
    """Upstream SSE bytes in, whole checked events out: each `data:` is a JSON object (a chunk with `choices`, or an
    `error`) until `data: [DONE]`; anything else raises UpstreamAnswerError."""

    def __init__(self) -> None:
        self._buf = b""
        self.done = False

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        """The events `chunk` completes, each with its blank line; [DONE] is the last one ever given. A generator,
        so the good events before a broken one in the same chunk still go out."""
        self._buf += chunk
        while not self.done:
            end = _EVENT_END.search(self._buf)
            if end is None:
                if len(self._buf) > MAX_EVENT_BYTES:
                    raise UpstreamAnswerError(f"sent an event of more than {MAX_EVENT_BYTES} bytes")
                return
            event, self._buf = self._buf[:end.start()], self._buf[end.end():]
            yield self._check(event)

    def finish(self) -> None:
        """The upstream closed its stream: it must have sent [DONE]."""
        if not self.done:
            raise UpstreamAnswerError("ended its stream without data: [DONE]")

    def _check(self, event: bytes) -> bytes:
        """The event to pass on. An upstream error event is re-written with "error" first: the form by which the
        answer cache knows a failed stream (it keeps no stream with an error event)."""
        data = [line[5:].removeprefix(b" ") for line in _LINE_END.split(event) if line.startswith(b"data:")]
        payload = b"\n".join(data)
        if payload.strip() == b"[DONE]":
            self.done = True
        elif data:  # (comments and keep-alives carry no data)
            obj = _json(payload)
            if isinstance(obj, dict) and "error" in obj:
                return b"data: " + json.dumps({"error": obj.pop("error"), **obj}, ensure_ascii=False,
                                              separators=(",", ":")).encode() + b"\n\n"
            if not isinstance(obj, dict) or not isinstance(obj.get("choices"), list):
                raise UpstreamAnswerError(f"sent an event that is not a completion chunk: {_snippet(payload)}")
        return event + b"\n\n"
