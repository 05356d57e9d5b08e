"""The engine clients all implement EngineClient (engine/protocol.py), and the engine package keeps to its own
names: no module in hearth/engine imports another module's private (_x) names. Checked without loading a model."""
from __future__ import annotations

import ast
import asyncio
import inspect
from pathlib import Path

import pytest

from hearth.config import EngineArgs
from hearth.engine.async_engine import AsyncEngine
from hearth.engine.dp_engine import DataParallelEngine
from hearth.engine.engine_worker import WorkerOptions
from hearth.engine.process_engine import ProcessEngine
from hearth.engine.protocol import EngineClient, EngineRequest, WorkerEngineClient, engine_requests
from hearth.sampling_params import SamplingParams

ENGINE = Path(__file__).resolve().parents[2] / "hearth" / "engine"
METHODS = [name for name, value in vars(EngineClient).items() if not name.startswith("_") and callable(value)]


@pytest.mark.parametrize("cls", [ProcessEngine, DataParallelEngine])
def test_worker_clients_load_kill_and_render_metrics(cls) -> None:
    for name in ("load", "render_metrics"):
        assert inspect.iscoroutinefunction(getattr(cls, name)), f"{cls.__name__}.{name} must be async"
    assert inspect.signature(cls.load).parameters["timeout"].default is None
    assert callable(getattr(cls, "kill", None))


@pytest.mark.parametrize("cls", [AsyncEngine, ProcessEngine, DataParallelEngine])
def test_every_client_has_the_methods(cls) -> None:
    assert {"generate", "abort", "check_structured", "start", "shutdown"} <= set(METHODS)
    missing = [m for m in METHODS if not callable(getattr(cls, m, None))]
    assert not missing, f"{cls.__name__} lacks {missing}"
    for name in ("generate", "check_structured"):
        assert inspect.iscoroutinefunction(getattr(cls, name)), f"{cls.__name__}.{name} must be async"


def test_worker_clients_are_engine_clients_without_a_process() -> None:
    """(AsyncEngine needs a loaded engine: tests/unit/test_serve_flags.py builds one.)"""
    opts = WorkerOptions("tiny")
    for client in (ProcessEngine(EngineArgs(model="unused"), opts),
                   DataParallelEngine(EngineArgs(model="unused"), opts, [None], load_timeout=1, restart=False)):
        assert isinstance(client, EngineClient) and isinstance(client, WorkerEngineClient)
        assert client.info is None and client.metrics is None and client.dead is None


def test_engine_requests_take_the_old_tuples_too() -> None:
    params = SamplingParams(max_tokens=1)
    got = engine_requests([("a", [1, 2], params), EngineRequest("b", [3], params)])
    assert got == [EngineRequest("a", [1, 2], params), EngineRequest("b", [3], params)]


def test_no_engine_module_imports_private_names() -> None:
    offenders = []
    for path in sorted(ENGINE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hearth"):
                offenders += [f"{path.name}: {node.module}.{a.name}" for a in node.names
                              if a.name.startswith("_") and not a.name.startswith("__")]
    assert not offenders, offenders


def test_a_worker_checks_a_constraint_and_the_front_raises_its_error() -> None:
    """ProcessEngine.check_structured asks its worker (here a pipe stand-in answering at once) and raises the
    compile error it sends back; a worker that is gone answers nothing and the check passes (generate() fails)."""
    from hearth.engine import worker_protocol as wp
    from hearth.structured.params import StructuredOutputsParams

    async def run() -> None:
        e = ProcessEngine(EngineArgs(model="unused"), WorkerOptions("tiny"))
        e._loop = asyncio.get_running_loop()
        e.info = object()  # loaded, as far as the front is concerned

        class Pipe:
            def send(self, msg) -> None:
                assert isinstance(msg, wp.CheckStructured)
                e._loop.call_soon(e._on_message, wp.StructuredChecked(msg.qid, ValueError("bad regex")))

        e._conn = Pipe()
        with pytest.raises(ValueError, match="bad regex"):
            await e.check_structured(StructuredOutputsParams(regex="("))
        assert not e._checks
        e._conn = type("Silent", (), {"send": lambda self, msg: None})()
        pending = asyncio.ensure_future(e.check_structured(StructuredOutputsParams(regex="a")))
        await asyncio.sleep(0)
        e._on_exit(-9)
        assert await pending is None

    asyncio.run(run())


def test_a_worker_adds_a_lora_adapter_and_the_front_raises_its_error() -> None:
    """ProcessEngine.add_lora sends the adapter to its worker and raises the LoRAError it answers; a data-parallel
    engine adds it on every rank."""
    from hearth.engine import worker_protocol as wp
    from hearth.errors import LoRAError
    from hearth.lora.request import LoRARequest

    lora = LoRARequest("a", 1, "/adapters/a")

    def worker(e: ProcessEngine, sent: list, error: Exception | None):
        class Pipe:
            def send(self, msg) -> None:
                sent.append(msg)
                if isinstance(msg, wp.AddLoRA):
                    e._loop.call_soon(e._on_message, wp.LoRAAdded(msg.qid, error))
        return Pipe()

    async def run() -> None:
        e = ProcessEngine(EngineArgs(model="unused"), WorkerOptions("tiny"))
        e._loop, e.info, sent = asyncio.get_running_loop(), object(), []
        e._conn = worker(e, sent, LoRAError("LoRA adapter '/adapters/a': no such folder"))
        with pytest.raises(LoRAError, match="no such folder"):
            await e.add_lora(lora)
        e._conn = worker(e, sent, None)
        await e.add_lora(lora)
        await e.remove_lora(1)
        assert [type(m) for m in sent] == [wp.AddLoRA, wp.AddLoRA, wp.RemoveLoRA] and sent[0].lora == lora
        assert not e._checks
        dp = DataParallelEngine(EngineArgs(model="unused"), WorkerOptions("tiny"), [None, None], load_timeout=1,
                                restart=False)
        added = []
        for rank in dp.ranks:
            rank.add_lora = lambda lora, rank=rank: asyncio.sleep(0, added.append(rank))
        await dp.add_lora(lora)
        assert len(added) == 2

    asyncio.run(run())
