"""Graceful shutdown (issue 32): streams open at the drain deadline end with an error event and [DONE], and the
process exits 0 after SIGTERM or SIGINT."""
from __future__ import annotations

import json
import signal
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.server.conftest import TINY_ARGS, start_server, wait_until


def _read_stream(url: str, i: int, started: list[int]) -> list[str]:
    body = {"prompt": f"stream {i}", "max_tokens": 240, "ignore_eos": True, "stream": True}
    lines = []
    with httpx.Client(timeout=60) as c, c.stream("POST", url + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        started.append(i)  # accepted by the engine (queued or running): the response has begun
        for line in r.iter_lines():
            if line:
                lines.append(line)
    return lines


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_ends_open_streams_and_exits_0(tiny_model: str, tmp_path, sig: signal.Signals) -> None:
    # One slot and a zero drain: at the signal, the stream running and the ones waiting are all cut.
    srv = start_server([tiny_model, *TINY_ARGS, "--max-num-seqs", "1", "--drain-timeout", "0"],
                       str(tmp_path / "server.log"))
    try:
        started: list[int] = []
        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(_read_stream, srv.url, i, started) for i in range(6)]
            # NOTE: all six connections accepted first: a connection still in the listen backlog when the
            # listener closes is reset by the kernel, which no server can answer.
            assert wait_until(lambda: len(started) == 6, timeout=30, interval=0.01)
            srv.proc.send_signal(sig)
            streams = [f.result() for f in futures]
        code = srv.proc.wait(30)
    finally:
        srv.stop(5)
    assert code == 0, srv.read_log()[-3000:]
    cut = 0
    for lines in streams:
        assert lines and lines[-1] == "data: [DONE]", lines[-3:]
        events = [json.loads(x[len("data: "):]) for x in lines[:-1]]
        if events and "error" in events[-1]:
            assert events[-1]["error"]["code"] == "server_shutting_down"
            cut += 1
        else:
            assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert cut >= 1, "no stream was still open at the drain deadline"
