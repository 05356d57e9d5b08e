"""`hearth serve`'s parsed flags turned into what its deployment mode builds, before any model loads or socket
opens: one model in process, engines in worker processes behind a ModelRouter (several models, data parallel), or
Ray Serve replicas. run_serve executes the plan; tests/unit/test_serve_flags.py walks every flag through it.

A flag a mode cannot apply is refused here with a one-line error naming it, never silently dropped.
"""
from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hearth.config import EngineArgs
    from hearth.entrypoints.openai.lora_modules import LoRAModule
    from hearth.entrypoints.openai.model_router import ModelRouter, RouterConfig
    from hearth.entrypoints.openai.model_specs import ModelSpec
    from hearth.entrypoints.openai.server import ServerConfig
    from hearth.entrypoints.openai.serving_build import ServeOptions
    from hearth.ray.plan import AppPlan

# vLLM flags (and field reports' flags) accepted so their command lines run unchanged; they mean nothing here
# (their --help says so).
VLLM_NO_OPS = frozenset({"disable_log_requests", "load_format", "enable_chunked_prefill",
                         "distributed_executor_backend", "num_gpu_blocks", "cpu_kv_cache"})
RAY_FLAGS = ("ray_address", "num_replicas", "min_replicas", "max_replicas", "target_ongoing_requests",
             "num_cpus_per_replica")
ROUTER_FLAGS = ("models_dir", "models_config", "max_loaded_models", "models_memory", "idle_unload_seconds",
                "model_load_timeout", "data_parallel_size")
GATEWAY_FLAGS = ("upstream", "upstream_api_key", "upstream_model", "upstream_min_prompt_tokens", "upstream_timeout",
                 "blocklist", "answer_cache_size", "answer_cache_ttl")
# LoRA adapters are served by name by one model, in process or data parallel (several models behind the router and
# Ray replicas have no adapter names yet).
LORA_FLAGS = ("enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras", "lora_modules")
# What the front's own HTTP server (uvicorn + the site guard) applies; under Ray, Ray Serve's proxy answers instead.
FRONT_HTTP_FLAGS = ("allowed_hosts", "allowed_origins", "header_timeout", "body_timeout", "uvicorn_log_level")


@dataclass
class FrontPlan:
    """The HTTP front of `hearth serve` (one model in process, or the router's front)."""
    server: ServerConfig
    host: str
    port: int
    log_level: str  # uvicorn's
    header_timeout: float


@dataclass
class InProcessPlan:
    engine: EngineArgs
    serve: ServeOptions
    front: FrontPlan
    lora_modules: list[LoRAModule] = field(default_factory=list)  # --lora-modules, loaded before serving


@dataclass
class RouterPlan:
    specs: list[ModelSpec]
    base: EngineArgs  # each model's EngineArgs start from it (its --models-config entry overrides)
    config: RouterConfig  # holds the ServeOptions every model's context and worker processes get
    front: FrontPlan
    lora_modules: list[LoRAModule] = field(default_factory=list)  # -dp with one model: --lora-modules

    def build(self) -> ModelRouter:
        from hearth.entrypoints.openai.model_router import ModelRouter

        return ModelRouter(self.specs, self.base, self.config, self.lora_modules)


@dataclass
class RayPlan:
    app: AppPlan  # the deployments (hearth.ray.plan)
    address: str | None  # --ray-address (None: RAY_ADDRESS, else a local Ray)
    host: str
    port: int


def plan_serve(ns: argparse.Namespace) -> InProcessPlan | RouterPlan | RayPlan:
    """Raises ValueError (a one-line CLI error) for a bad value or a flag this mode cannot apply."""
    from hearth.entrypoints.cli import engine_args_from
    from hearth.entrypoints.openai.cli_models import router_parts
    from hearth.entrypoints.openai.lora_modules import parse_lora_modules
    from hearth.entrypoints.openai.serving_build import ServeOptions

    if ns.ray:
        return _plan_ray(ns)
    _refuse(ns, RAY_FLAGS, "needs --ray")
    _check_gateway_flags(ns)
    front = _plan_front(ns)
    serve = ServeOptions.from_namespace(ns)
    parts = router_parts(ns, serve)
    if parts is not None:  # several models and/or data parallel: engines in worker processes
        if serve.gateway is not None:
            _refuse(ns, GATEWAY_FLAGS, "is for one model: drop it, or --models-dir / --data-parallel-size")
        if ns.models_dir is not None or ns.models_config is not None:
            _refuse(ns, LORA_FLAGS, "is for one model for now: drop it, or --models-dir / --models-config")
        if ns.lora_modules and not parts[1].enable_lora:
            raise ValueError("--lora-modules needs --enable-lora")
        return RouterPlan(*parts, front, parse_lora_modules(ns.lora_modules))
    _refuse(ns, ("model_load_timeout",), "needs --models-dir, --models-config or --data-parallel-size")
    engine = engine_args_from(ns)
    if serve.gateway is not None:
        _refuse(ns, LORA_FLAGS, "cannot be combined with the gateway flags (--upstream, --blocklist, "
                "--answer-cache-size) for now")
    if ns.lora_modules and not engine.enable_lora:
        raise ValueError("--lora-modules needs --enable-lora")
    return InProcessPlan(engine, serve, front, parse_lora_modules(ns.lora_modules))


def _plan_front(ns: argparse.Namespace) -> FrontPlan:
    from hearth import envs
    from hearth.entrypoints.openai.server import ServerConfig
    from hearth.entrypoints.openai.serving_keys import key_ring
    from hearth.entrypoints.openai.site_guard import default_allowed_hosts

    _check_port(ns.port)
    for flag, value in (("--header-timeout", ns.header_timeout), ("--body-timeout", ns.body_timeout)):
        if value <= 0:
            raise ValueError(f"{flag} must be > 0, got {value}")
    if ns.api_key_file:  # a broken key file fails now, not after the model has loaded
        key_ring(ns.api_key, ns.api_key_file, None)
    api_key = ns.api_key or (envs.api_key() if not ns.api_key_file else None)
    hosts = ns.allowed_hosts if ns.allowed_hosts is not None else default_allowed_hosts(ns.host)
    server = ServerConfig(api_key, ns.max_request_body_bytes, ns.drain_timeout, ns.api_key_file, hosts,
                          ns.allowed_origins, ns.body_timeout)
    return FrontPlan(server, ns.host, ns.port, ns.uvicorn_log_level, ns.header_timeout)


def _plan_ray(ns: argparse.Namespace) -> RayPlan:
    import dataclasses

    from hearth import envs
    from hearth.entrypoints.cli import engine_args_from
    from hearth.entrypoints.openai.serving_build import ServeOptions
    from hearth.ray.plan import plan_app

    _refuse(ns, ROUTER_FLAGS, "is not available with --ray: Ray Serve scales with --num-replicas")
    _refuse(ns, FRONT_HTTP_FLAGS, "is not applied with --ray: Ray Serve's own HTTP proxy answers; drop it")
    _refuse(ns, LORA_FLAGS, "is for one model in process for now: drop it, or --ray")
    _check_gateway_flags(ns)
    _check_port(ns.port)
    engine = dataclasses.asdict(engine_args_from(ns))  # (MODEL or --model, --task: as without --ray)
    model = engine.pop("model")
    app = plan_app(model, num_replicas=ns.num_replicas, min_replicas=ns.min_replicas, max_replicas=ns.max_replicas,
                   target_ongoing_requests=ns.target_ongoing_requests, num_cpus_per_replica=ns.num_cpus_per_replica,
                   api_key=ns.api_key or (envs.api_key() if not ns.api_key_file else None),
                   api_key_file=ns.api_key_file, serve=ServeOptions.from_namespace(ns),
                   max_request_body_bytes=ns.max_request_body_bytes, drain_timeout=ns.drain_timeout,
                   engine_args=engine)
    return RayPlan(app, ns.ray_address, ns.host, ns.port)


def _check_port(port: int) -> None:
    if not 0 <= port < 65536:
        raise ValueError(f"--port must be in [0, 65535], got {port}")


def _check_gateway_flags(ns: argparse.Namespace) -> None:
    """Gateway settings that only mean something beside another gateway flag."""
    if ns.upstream is None:
        _refuse(ns, ("upstream_api_key", "upstream_timeout"), "needs --upstream URL")
    if not ns.answer_cache_size:
        _refuse(ns, ("answer_cache_ttl",), "needs --answer-cache-size N")


def given(ns: argparse.Namespace, dest: str) -> bool:
    """Whether the flag was set to something else than its default."""
    return getattr(ns, dest, None) != _serve_actions()[dest].default


def _refuse(ns: argparse.Namespace, dests: tuple[str, ...], why: str) -> None:
    for dest in dests:
        if given(ns, dest):
            options = _serve_actions()[dest].option_strings
            raise ValueError(f"{max(options, key=len) if options else dest.upper()} {why}")


@functools.cache
def _serve_actions() -> dict[str, argparse.Action]:
    """Every `hearth serve` flag by its dest, from the parser itself (defaults and names cannot drift from it)."""
    from hearth.entrypoints.openai.cli_serve import add_serve_args

    p = argparse.ArgumentParser(add_help=False)
    add_serve_args(p)
    return {a.dest: a for a in p._actions}
