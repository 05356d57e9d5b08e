"""What a Ray Serve hearth application is made of, computed without Ray: the model deployment's options, the
EngineArgs and serving options every replica assembles from (entrypoints/openai/serving_build.py, as `hearth
serve` does), and the ingress's arguments. hearth.ray.build_app turns it into Ray deployments; tests read it."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from hearth.entrypoints.openai.cli_ray import DEFAULT_TARGET_ONGOING_REQUESTS
from hearth.entrypoints.openai.serving_build import ServeOptions


@dataclass
class ReplicaServerConfig:
    serve: ServeOptions = field(default_factory=ServeOptions)  # the same serving options as `hearth serve`
    max_body_bytes: int = 16 * 1024 * 1024
    drain_timeout: float = 30.0


@dataclass
class IngressArgs:
    api_key: str | None
    max_body_bytes: int
    key_specs: list | None  # --api-key-file's keys and limits (api_keys.KeySpec), read here


@dataclass
class AppPlan:
    model_options: dict[str, Any]  # serve.deployment options of the model deployment
    engine_kwargs: dict[str, Any]  # hearth.config.EngineArgs fields, one engine per replica
    server: ReplicaServerConfig
    ingress: IngressArgs


def _physical_cores() -> int:
    import psutil

    return psutil.cpu_count(logical=False) or 1


def plan_app(model: str | None, *, num_replicas: int | None, min_replicas: int | None, max_replicas: int | None,
             target_ongoing_requests: float, num_cpus_per_replica: float | None, api_key: str | None,
             api_key_file: str | None, serve: ServeOptions, max_request_body_bytes: int, drain_timeout: float,
             engine_args: dict[str, Any]) -> AppPlan:
    """Raises ValueError on bad values (see hearth.ray.build_app)."""
    from hearth.config import EngineArgs
    from hearth.entrypoints.openai.api_keys import parse_key_file

    if engine_args.get("tensor_parallel_size", 1) != 1:
        raise ValueError("--tensor-parallel-size: tensor parallelism is not available with Ray Serve replicas")
    engine_args = {k: v for k, v in engine_args.items() if k != "tensor_parallel_size"}
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    unknown = sorted(set(engine_args) - fields)
    if unknown:
        raise ValueError(f"unknown engine arguments {unknown}; see hearth.config.EngineArgs")
    if num_cpus_per_replica is None:
        num_cpus_per_replica = float(engine_args.get("threads") or _physical_cores())
    if num_cpus_per_replica <= 0:
        raise ValueError(f"--num-cpus-per-replica must be > 0, got {num_cpus_per_replica}")
    engine_args = {**engine_args, "model": model}
    engine_args.setdefault("threads", None)
    if engine_args["threads"] is None:
        engine_args["threads"] = max(1, int(num_cpus_per_replica))
    # NOTE: Ray may place several replicas on one node; hearth's automatic pinning would stack them on the same
    # cores, so replicas leave placement to the OS unless a core list is given.
    if engine_args.get("omp_threads_bind") in (None, "auto"):
        engine_args["omp_threads_bind"] = "nobind"
    EngineArgs(**engine_args)  # (a wrong field fails here, not in every replica)

    options: dict[str, Any] = {"ray_actor_options": {"num_cpus": num_cpus_per_replica},
                               # Ray's default (5) would cap a replica below its batch: let hearth's scheduler queue.
                               "max_ongoing_requests": max(2 * (engine_args.get("max_num_seqs") or 64), 16)}
    if min_replicas is not None or max_replicas is not None:
        lo = 1 if min_replicas is None else min_replicas
        hi = max(lo, num_replicas or 1) if max_replicas is None else max_replicas
        if not 0 <= lo <= hi or hi < 1:
            raise ValueError(f"need 0 <= --min-replicas <= --max-replicas and --max-replicas >= 1, got {lo}, {hi}")
        if target_ongoing_requests <= 0:
            raise ValueError(f"--target-ongoing-requests must be > 0, got {target_ongoing_requests}")
        start = lo if num_replicas is None else min(max(num_replicas, lo), hi)
        options["autoscaling_config"] = {"min_replicas": lo, "max_replicas": hi, "initial_replicas": start,
                                         "target_ongoing_requests": target_ongoing_requests}
    else:
        if target_ongoing_requests != DEFAULT_TARGET_ONGOING_REQUESTS:
            raise ValueError("--target-ongoing-requests is the autoscaling target: it needs --min-replicas or "
                             "--max-replicas")
        num_replicas = 1 if num_replicas is None else num_replicas
        if num_replicas < 1:
            raise ValueError(f"--num-replicas must be >= 1, got {num_replicas}")
        options["num_replicas"] = num_replicas

    if api_key and api_key_file:
        raise ValueError("--api-key and --api-key-file both given: pass one (put a shared key in the file)")
    keys = parse_key_file(api_key_file) if api_key_file else None  # (a broken file fails here, not in the ingress)
    return AppPlan(options, engine_args, ReplicaServerConfig(serve, max_request_body_bytes, drain_timeout),
                   IngressArgs(api_key, max_request_body_bytes, keys))
