"""A request sent to a worker that has just died (before the front's reader thread has seen the exit) fails with a
clear 503 that says it had not started, never a BrokenPipeError 500; behind data parallelism another engine takes
it. Deterministic: the pipe and the exit are simulated, no process is spawned."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from hearth.config import EngineArgs
from hearth.engine import worker_protocol as wp
from hearth.engine.dp_engine import DataParallelEngine
from hearth.engine.engine_worker import WorkerOptions
from hearth.engine.process_engine import NotStartedError, ProcessEngine
from hearth.sampling_params import SamplingParams


class _BrokenPipe:
    def send(self, msg: tuple) -> None:
        raise BrokenPipeError(32, "Broken pipe")


class _Accepting:
    """A live worker's pipe: every add is accepted at once (on the loop, as the reader thread would)."""

    def __init__(self, engine: ProcessEngine) -> None:
        self.engine, self.sent = engine, []

    def send(self, msg: wp.ToWorker) -> None:
        self.sent.append(msg)
        if isinstance(msg, wp.AddRequests):
            self.engine._loop.call_soon(self.engine._on_message, wp.Accepted(msg.sid, None))


def _engine(label: str) -> ProcessEngine:
    e = ProcessEngine(EngineArgs(model="unused"), WorkerOptions(name="tiny", engine_label=label))
    e.info = SimpleNamespace(tokenizer=None)  # loaded, as far as generate() is concerned
    return e


def _just_killed(e: ProcessEngine) -> None:
    """The worker was SIGKILLed: sends fail now, the reader thread reports the exit a moment later."""
    e._conn = _BrokenPipe()
    e._loop.call_later(0.05, e._on_exit, -9)


SUBS = [("r0", [1, 2, 3], SamplingParams(max_tokens=4))]


def test_send_to_a_dead_worker_is_a_not_started_503() -> None:
    async def run() -> None:
        e = _engine("0")
        e._loop = asyncio.get_running_loop()
        _just_killed(e)
        with pytest.raises(NotStartedError) as info:
            await e.generate(SUBS)
        assert info.value.status_code == 503
        msg = str(info.value)
        assert "engine 0" in msg and "killed by signal 9" in msg and "had not started" in msg, msg
        assert e.in_flight == 0 and not e._streams and not e._rid_sid  # nothing leaked on the front side

    asyncio.run(run())


def test_data_parallel_resends_a_not_started_request_to_a_live_engine() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        dp = DataParallelEngine(EngineArgs(model="unused"), WorkerOptions(name="tiny"), [None, None],
                                load_timeout=5, restart=False)
        dead, live = _engine("0"), _engine("1")
        dp.ranks = [dead, live]
        for e in dp.ranks:
            e._loop = loop
        live._conn = _Accepting(live)
        _just_killed(dead)  # the router picks it: least in flight, and not yet known dead
        stream = await dp.generate(SUBS)
        assert [type(m) for m in live._conn.sent] == [wp.AddRequests]
        assert stream is not None and live.in_flight == 1 and dead.in_flight == 0

    asyncio.run(run())


class _AnsweringBeforeAccepting:
    """A worker whose step's outputs (the whole answer) reach the front before its Accepted, as they can: both
    are posted from the worker's event loop, in whichever order its callbacks run."""

    def __init__(self, engine: ProcessEngine) -> None:
        self.engine = engine

    def send(self, msg: wp.ToWorker) -> None:
        if isinstance(msg, wp.AddRequests):
            from hearth.engine.outputs import StepOutput

            out = StepOutput(msg.requests[0].request_id, 0, [7], [], finished=True, finish_reason="length",
                             num_output_tokens=1)
            loop = self.engine._loop
            loop.call_soon(self.engine._on_message, wp.Outputs([(msg.sid, [out]), (msg.sid, wp.STREAM_END)]))
            loop.call_soon(self.engine._on_message, wp.Accepted(msg.sid, None))


def test_outputs_that_overtake_the_accept_still_answer() -> None:
    """The stream ended (and was forgotten) before Accepted arrived: generate() must not wait for it forever."""
    async def run() -> list:
        e = _engine("0")
        e._loop = asyncio.get_running_loop()
        e._conn = _AnsweringBeforeAccepting(e)
        stream = await asyncio.wait_for(e.generate([("r0", [1, 2, 3], SamplingParams(max_tokens=1,
                                                                                    detokenize=False))]), 5)
        outs = [o async for o in stream]
        assert e.in_flight == 0
        return outs

    outs = asyncio.run(run())
    assert [(o.new_token_ids, o.finish_reason) for o in outs] == [([7], "length")]
