"""Every `hearth serve` flag reaches every deployment mode's assembly, or that mode refuses it with an error naming
it; a flag that no mode uses fails. The flags come from the serve parser itself, so a new flag is covered at once
(give it a value in VALUES if the generic one does not parse).

Modes: one model in process, data parallel and several models (engines in worker processes behind a ModelRouter),
Ray Serve replicas. The plans are compared before and after setting the flag (serve_plan.plan_serve, nothing loads);
then the assemblies themselves (in process, a worker process, the router's contexts, a Ray replica) are shown to
apply what the plans hand them, on a tiny model, without spawning a process or starting Ray."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import types
from pathlib import Path

import pytest

from hearth.entrypoints.openai.cli_serve import add_serve_args
from hearth.entrypoints.openai.serve_plan import VLLM_NO_OPS, InProcessPlan, RayPlan, RouterPlan, plan_serve

KEYS_TOML = '[[keys]]\nname = "alice"\nkey = "sk-alice-0123456789abcdef"\n'
# Values a generic one (below) would not parse or validate; {tmp} is the test's folder.
VALUES: dict[str, list[str]] = {
    "model": ["other/model"],
    "model_flag": ["other/model"],
    "served_model_name": ["other-name"],
    "omp_threads_bind": ["0"],
    "speculative_config": ['{"method": "ngram", "num_speculative_tokens": 2}'],
    "override_generation_config": ['{"temperature": 0.5}'],
    "pooler_config": ['{"pooling_type": "MEAN"}'],
    "generation_config": ["vllm"],
    "models_dir": ["{tmp}/models"],
    "models_config": ["{tmp}/models.toml"],
    "api_key_file": ["{tmp}/keys.toml"],
    "blocklist": ["{tmp}/blocklist.txt"],
    "upstream": ["http://gpu.example:8000/v1"],
    "allowed_hosts": ["api.example"],
    "allowed_origins": ["https://app.example"],
    "ray_address": ["auto"],
    "port": ["8123"],
    "threads": ["1"],
    "tensor_parallel_size": ["2"],
    "max_num_seqs": ["8"],
}
MODES: dict[str, tuple[str | None, list[str]]] = {  # name -> (MODEL, options)
    "in-process": ("some/model", []),
    "data-parallel": ("some/model", ["--data-parallel-size", "2"]),
    "models-dir": (None, ["--models-dir", "{tmp}/models"]),
    "ray": ("some/model", ["--ray"]),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hearth serve")
    add_serve_args(p)
    return p


PARSER = _parser()
ACTIONS = [a for a in PARSER._actions if a.dest != "help"]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("serve_flags")
    (root / "models").mkdir()
    for name in ("alpha", "beta"):
        (root / "models" / f"{name}.gguf").write_bytes(b"GGUF")
    (root / "models.toml").write_text(f'[[models]]\nname = "gamma"\npath = "{root}/models/alpha.gguf"\n')
    (root / "keys.toml").write_text(KEYS_TOML)
    (root / "blocklist.txt").write_text("forbidden\n")
    return root


def _flag_argv(action: argparse.Action, tmp: Path) -> list[str]:
    """The flag set to something other than its default."""
    if action.dest in VALUES:
        values = [v.replace("{tmp}", str(tmp)) for v in VALUES[action.dest]]
    elif action.nargs == 0:  # store_true / store_false
        values = []
    elif action.choices:
        values = [next(str(c) for c in action.choices if c != action.default and c not in ("auto", None))]
    elif action.type is int:
        values = [str((action.default or 1) * 2 + 1)]
    elif action.type is float:
        values = [str((action.default or 1.0) * 2 + 0.5)]
    else:
        values = ["x"]
    return values if not action.option_strings else [action.option_strings[-1], *values]


def _argv(mode: str, action: argparse.Action | None, tmp: Path) -> list[str]:
    model, options = MODES[mode]
    options = [o.replace("{tmp}", str(tmp)) for o in options]
    if action is not None and not action.option_strings:  # the positional MODEL
        model = None
        options = [*_flag_argv(action, tmp), *options]
    elif action is not None:
        options = [*options, *_flag_argv(action, tmp)]
    return ([model] if model is not None else []) + options


def _snapshot(plan: InProcessPlan | RouterPlan | RayPlan) -> str:
    """What the mode builds from the flags: for the router, what each model's worker processes and context get."""
    if isinstance(plan, RouterPlan):
        router = plan.build()
        per_model = [(e.spec, e.args, router.worker_options(e), router.serve_options(e)) for e in router.entries]
        return repr((type(plan), plan.front, dataclasses.replace(plan.config, serve=None), per_model,
                     router.lora_modules))
    return repr((type(plan), plan))


def _plan(argv: list[str]):
    return plan_serve(PARSER.parse_args(argv))


def _names(error: Exception, action: argparse.Action) -> bool:
    text = str(error)
    return any(opt in text for opt in action.option_strings) or (not action.option_strings and "MODEL" in text)


@pytest.mark.parametrize("mode", list(MODES))
def test_every_flag_reaches_each_mode_or_is_refused_by_name(mode: str, tmp: Path, monkeypatch) -> None:
    monkeypatch.delenv("HEARTH_API_KEY", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    base = _snapshot(_plan(_argv(mode, None, tmp)))
    ignored, unnamed = [], []
    for action in ACTIONS:
        if action.dest in VLLM_NO_OPS or set(action.option_strings) & set(MODES[mode][1]):
            continue  # (the flags that select this mode: the other modes show where they lead)
        try:
            plan = _plan(_argv(mode, action, tmp))
        except ValueError as e:
            if not _names(e, action):
                unnamed.append(f"{action.dest}: {e}")
            continue
        if _snapshot(plan) == base:
            ignored.append(action.dest)
    assert not ignored, f"{mode}: these flags are accepted and change nothing (apply or refuse them): {ignored}"
    assert not unnamed, f"{mode}: refused without naming the flag: {unnamed}"


def test_the_vllm_no_ops_are_serve_flags_and_change_nothing(tmp: Path) -> None:
    dests = {a.dest: a for a in ACTIONS}
    assert VLLM_NO_OPS <= set(dests), VLLM_NO_OPS - set(dests)
    for mode in MODES:
        base = _snapshot(_plan(_argv(mode, None, tmp)))
        for dest in VLLM_NO_OPS:
            assert _snapshot(_plan(_argv(mode, dests[dest], tmp))) == base, (mode, dest)


def test_ray_replicas_get_the_reasoning_parser(tmp: Path) -> None:
    plan = _plan(["some/model", "--ray", "--reasoning-parser", "qwen3", "--reasoning-budget", "64"])
    assert plan.app.server.serve.reasoning_parser == "qwen3" and plan.app.server.serve.reasoning_budget == 64


# ---- the assemblies apply what the plans give them ----

@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    from hearth import LLM
    from tests.tiny_models import build_checkpoint, tiny_config

    folder = build_checkpoint(str(tmp_path_factory.mktemp("serve_flags_ckpt") / "tiny"), tiny_config("llama"))
    return LLM(folder, dtype="float32", kv_cache_space=0.05, max_num_seqs=4).engine


def test_build_serving_applies_every_serve_option(llm, tmp: Path) -> None:
    from hearth.engine.client_options import ClientOptions
    from hearth.engine.protocol import EngineClient
    from hearth.entrypoints.openai.gateway import GatewayConfig
    from hearth.entrypoints.openai.serving_build import ServeOptions, build_serving

    opts = ServeOptions(ClientOptions(7, 0.25), "qwen3", None, GatewayConfig(answer_cache_size=3))
    serving = build_serving(llm, opts)
    assert serving.client.max_waiting_requests == 7 and serving.client.refill_wait_s == 0.25
    assert serving.ctx.reasoning_parser is not None and serving.ctx.reasoning_parser.name == "qwen3"
    assert serving.gateway is not None and serving.gateway.config.answer_cache_size == 3
    assert serving.ctx.engine is serving.client and serving.client.info.served_model_name == serving.ctx.model_name
    assert isinstance(serving.client, EngineClient)
    # (the tiny vocabulary has no </think>: a budget is refused by name, not dropped)
    with pytest.raises(ValueError, match="--reasoning-budget"):
        build_serving(llm, dataclasses.replace(opts, reasoning_budget=8))
    covered = {"client", "reasoning_parser", "reasoning_budget", "gateway"}
    assert {f.name for f in dataclasses.fields(ServeOptions)} == covered, "a new ServeOptions field: test it here"


def test_the_worker_process_assembles_its_client_from_its_options(llm, monkeypatch) -> None:
    """worker_main, run here with a pipe stand-in: it answers Ready with the model's info and builds its client
    from WorkerOptions.client (the same build_client as in process)."""
    from hearth.config import EngineArgs
    from hearth.engine import client_options, engine_worker
    from hearth.engine import worker_protocol as wp
    from hearth.engine.client_options import ClientOptions

    built = []
    real = client_options.build_client
    monkeypatch.setattr(client_options, "build_client", lambda *a, **k: built.append(real(*a, **k)) or built[-1])
    monkeypatch.setattr(engine_worker, "_build_engine", lambda args: llm)

    class Pipe:
        def __init__(self) -> None:
            self.sent: list = []
            self.inbox = [wp.Shutdown(0.0)]

        def send(self, msg) -> None:
            self.sent.append(msg)

        def recv(self):
            return self.inbox.pop(0)

    pipe = Pipe()
    opts = engine_worker.WorkerOptions("tiny", "3", ClientOptions(5, 0.125))
    engine_worker.worker_main(pipe, EngineArgs(model="unused"), opts)
    (client,) = built
    assert client.max_waiting_requests == 5 and client.refill_wait_s == 0.125
    assert client.metrics.labels == {"model_name": "tiny", "engine": "3"}
    ready = [m for m in pipe.sent if isinstance(m, wp.Ready)]
    assert ready and ready[0].info.max_model_len == llm.model_config.max_model_len


def test_the_router_gives_each_model_its_serving_options(llm, tmp: Path, monkeypatch) -> None:
    """The router's per-model contexts and worker options, with the worker processes replaced by an in-process
    client over the tiny engine."""
    from hearth.engine.client_options import ClientOptions, build_client
    from hearth.entrypoints.openai import model_router

    client = build_client(llm, ClientOptions())
    made = []

    class FakeDP:
        def __init__(self, args, opts, binds, load_timeout) -> None:
            made.append((args, opts))
            self.info, self.dead, self.loading, self.size, self.pids, self.in_flight = None, None, False, 1, [], 0

        async def load(self):
            self.info = client.info
            return self.info

        def shutdown(self, timeout: float = 30.0) -> None:
            pass

        check_structured, generate, abort, stats = client.check_structured, client.generate, client.abort, None

    monkeypatch.setattr(model_router, "DataParallelEngine", FakeDP)
    plan = _plan(["--models-dir", f"{tmp}/models", "--reasoning-parser", "deepseek_r1", "--max-waiting-requests",
                  "9", "--refill-wait-ms", "5"])
    router = plan.build()

    async def run():
        ctx = await router.context("beta")
        return ctx

    ctx = asyncio.run(run())
    assert ctx.model_name == "beta" and ctx.reasoning_parser.name == "deepseek_r1"
    (args, opts), = made
    assert args.model.endswith("beta.gguf") and opts.name == "beta"
    assert opts.client.max_waiting_requests == 9 and opts.client.refill_wait_s == 0.005


def test_a_ray_replica_assembles_like_hearth_serve(llm, monkeypatch) -> None:
    """HearthModel.__init__ with Ray's replica context and the load stubbed: its app serves the planned options."""
    pytest.importorskip("ray.serve")
    from ray import serve

    from hearth.ray import replica

    plan = _plan(["some/model", "--ray", "--reasoning-parser", "qwen3", "--max-waiting-requests", "4"])
    monkeypatch.setattr(serve, "get_replica_context",
                        lambda: types.SimpleNamespace(replica_tag="r1", app_name="hearth"))
    monkeypatch.setattr(replica, "_load_on_own_thread", lambda args: llm)

    async def run():
        model = replica.HearthModel.__new__(replica.HearthModel)
        await model.__init__(plan.app.engine_kwargs, plan.app.server)
        model._pusher.cancel()
        return model

    model = asyncio.run(run())
    ctx = model.app.state.ctx
    assert ctx.reasoning_parser is not None and ctx.reasoning_parser.name == "qwen3"
    assert model.engine.max_waiting_requests == 4
    model.engine.shutdown(0.0)
