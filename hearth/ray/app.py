"""`hearth.ray.build_app(...)`: hearth as a Ray Serve application (an OpenAI-compatible ingress deployment in front
of model deployments, each replica reserving num_cpus), for `serve.run` or a user's own composition."""
from __future__ import annotations

import dataclasses
from typing import Any

from hearth.entrypoints.openai.cli_ray import DEFAULT_TARGET_ONGOING_REQUESTS
from hearth.entrypoints.openai.gateway import GatewayConfig
from hearth.ray.ingress import HearthIngress
from hearth.ray.replica import HearthModel, ReplicaServerConfig

INGRESS_NAME = "HearthIngress"
MODEL_NAME = "HearthModel"


def _physical_cores() -> int:
    import psutil

    return psutil.cpu_count(logical=False) or 1


def build_app(model: str | None = None, *, num_replicas: int | None = None, min_replicas: int | None = None,
              max_replicas: int | None = None, target_ongoing_requests: float = DEFAULT_TARGET_ONGOING_REQUESTS,
              num_cpus_per_replica: float | None = None, api_key: str | None = None,
              api_key_file: str | None = None, gateway: GatewayConfig | None = None,
              max_waiting_requests: int | None = None, refill_wait_ms: float = 30.0,
              max_request_body_bytes: int = 16 * 1024 * 1024, drain_timeout: float = 30.0,
              **engine_args: Any) -> Any:
    """A Ray Serve application serving `model` (a path every node can read; None: the bundled SmolLM2).

    engine_args are hearth.config.EngineArgs fields (max_model_len=..., kv_cache_space=..., quantization=...).
    num_cpus_per_replica: CPUs each replica reserves (default: `threads` if given, else this machine's physical
    cores); each replica's engine uses that many threads unless `threads` says otherwise. min_replicas /
    max_replicas turn on Ray Serve autoscaling on ongoing requests per replica (target_ongoing_requests), starting
    from num_replicas (default 1; with autoscaling, min_replicas). api_key_file: per-user keys and limits (TOML,
    read here, enforced by the ingress: 401, 403, 429 as in `hearth serve`). gateway: hearth's gateway mode
    (upstream, blocklist, answer cache) in every replica (gateway.gateway_config_from builds one from the CLI
    flags). Raises ValueError on bad values.
    """
    from ray import serve

    from hearth.config import EngineArgs
    from hearth.entrypoints.openai.api_keys import parse_key_file

    if engine_args.get("tensor_parallel_size", 1) != 1:
        raise ValueError("tensor parallelism is not available with Ray Serve replicas")
    engine_args.pop("tensor_parallel_size", None)
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

    options: dict[str, Any] = {"name": MODEL_NAME, "ray_actor_options": {"num_cpus": num_cpus_per_replica},
                               # Ray's default (5) would cap a replica below its batch: let hearth's scheduler queue.
                               "max_ongoing_requests": max(2 * engine_args.get("max_num_seqs", 64), 16)}
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
        num_replicas = 1 if num_replicas is None else num_replicas
        if num_replicas < 1:
            raise ValueError(f"--num-replicas must be >= 1, got {num_replicas}")
        options["num_replicas"] = num_replicas

    if api_key and api_key_file:
        raise ValueError("--api-key and --api-key-file both given: pass one (put a shared key in the file)")
    keys = parse_key_file(api_key_file) if api_key_file else None  # (a broken file fails here, not in the ingress)
    server = ReplicaServerConfig(max_waiting_requests, refill_wait_ms / 1000, max_request_body_bytes, drain_timeout,
                                 gateway if gateway is not None and gateway.enabled else None)
    model_deployment = serve.deployment(HearthModel, **options)
    ingress = serve.deployment(serve.ingress()(HearthIngress), name=INGRESS_NAME,
                               ray_actor_options={"num_cpus": 0}, max_ongoing_requests=10_000)
    return ingress.bind(model_deployment.bind(engine_args, server), api_key,
                        max_request_body_bytes, keys)
