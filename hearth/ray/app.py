"""`hearth.ray.build_app(...)`: hearth as a Ray Serve application (an OpenAI-compatible ingress deployment in front
of model deployments, each replica reserving num_cpus), for `serve.run` or a user's own composition."""
from __future__ import annotations

from typing import Any

from hearth.engine.client_options import ClientOptions
from hearth.entrypoints.openai.cli_ray import DEFAULT_TARGET_ONGOING_REQUESTS
from hearth.entrypoints.openai.gateway import GatewayConfig
from hearth.entrypoints.openai.serving_build import ServeOptions
from hearth.ray.ingress import HearthIngress
from hearth.ray.plan import AppPlan, plan_app
from hearth.ray.replica import HearthModel

INGRESS_NAME = "HearthIngress"
MODEL_NAME = "HearthModel"


def build_app(model: str | None = None, *, num_replicas: int | None = None, min_replicas: int | None = None,
              max_replicas: int | None = None, target_ongoing_requests: float = DEFAULT_TARGET_ONGOING_REQUESTS,
              num_cpus_per_replica: float | None = None, api_key: str | None = None,
              api_key_file: str | None = None, gateway: GatewayConfig | None = None,
              max_waiting_requests: int | None = None, refill_wait_ms: float = 30.0,
              max_request_body_bytes: int = 16 * 1024 * 1024, drain_timeout: float = 30.0,
              reasoning_parser: str | None = None, reasoning_budget: int | None = None,
              serve_options: ServeOptions | None = None, **engine_args: Any) -> Any:
    """A Ray Serve application serving `model` (a path every node can read; None: the bundled SmolLM2).

    engine_args are hearth.config.EngineArgs fields (max_model_len=..., kv_cache_space=..., quantization=...).
    num_cpus_per_replica: CPUs each replica reserves (default: `threads` if given, else this machine's physical
    cores); each replica's engine uses that many threads unless `threads` says otherwise. min_replicas /
    max_replicas turn on Ray Serve autoscaling on ongoing requests per replica (target_ongoing_requests), starting
    from num_replicas (default 1; with autoscaling, min_replicas). api_key_file: per-user keys and limits (TOML,
    read here, enforced by the ingress: 401, 403, 429 as in `hearth serve`). gateway: hearth's gateway mode
    (upstream, blocklist, answer cache) in every replica (gateway.gateway_config_from builds one from the CLI
    flags). max_waiting_requests, refill_wait_ms, reasoning_parser, reasoning_budget, gateway: each replica's
    serving options, as `hearth serve`'s flags; serve_options gives them all at once (`hearth serve --ray` does)
    and then they must be left unset. Raises ValueError on bad values.
    """
    from ray import serve

    shorthand = ServeOptions(ClientOptions(max_waiting_requests, refill_wait_ms / 1000), reasoning_parser,
                             reasoning_budget, gateway if gateway is not None and gateway.enabled else None)
    if serve_options is None:
        serve_options = shorthand
    elif shorthand != ServeOptions(ClientOptions(None, 0.03)):
        raise ValueError("pass serve_options or its fields (max_waiting_requests, refill_wait_ms, gateway, "
                         "reasoning_parser, reasoning_budget), not both")
    plan = plan_app(model, num_replicas=num_replicas, min_replicas=min_replicas, max_replicas=max_replicas,
                    target_ongoing_requests=target_ongoing_requests, num_cpus_per_replica=num_cpus_per_replica,
                    api_key=api_key, api_key_file=api_key_file, serve=serve_options,
                    max_request_body_bytes=max_request_body_bytes, drain_timeout=drain_timeout,
                    engine_args=engine_args)
    return deploy_plan(plan)


def deploy_plan(plan: AppPlan) -> Any:
    """The Ray Serve application of a plan (hearth.ray.plan): the model deployment behind the ingress."""
    from ray import serve

    model_deployment = serve.deployment(HearthModel, name=MODEL_NAME, **plan.model_options)
    ingress = serve.deployment(serve.ingress()(HearthIngress), name=INGRESS_NAME,
                               ray_actor_options={"num_cpus": 0}, max_ongoing_requests=10_000)
    i = plan.ingress
    return ingress.bind(model_deployment.bind(plan.engine_kwargs, plan.server), i.api_key, i.max_body_bytes,
                        i.key_specs)
