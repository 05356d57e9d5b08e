"""One assembly of a model's serving stack (metrics + engine client + ServingContext + gateway) from the parsed
serve options, used by every deployment mode: `hearth serve MODEL` (in process), the model router's per-model
contexts (engines in worker processes, which build their client with the same engine.client_options.build_client),
and each Ray Serve replica. A serve option added to ServeOptions reaches all of them by construction."""
from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hearth.engine.client_options import ClientOptions, build_client
from hearth.engine.protocol import EngineClient
from hearth.entrypoints.openai.model_specs import SERVING_KEYS  # what a --models-config entry may set per model

if TYPE_CHECKING:
    from hearth.engine.llm_engine import LLMEngine
    from hearth.entrypoints.openai.gateway import Gateway, GatewayConfig
    from hearth.entrypoints.openai.lora_adapters import LoRAAdapters
    from hearth.entrypoints.openai.lora_modules import LoRAModule
    from hearth.entrypoints.openai.serving_common import ServingContext


@dataclass
class ServeOptions:
    """The per-model serving options of `hearth serve` (picklable: a Ray replica receives them)."""
    client: ClientOptions = field(default_factory=ClientOptions)
    reasoning_parser: str | None = None  # --reasoning-parser
    reasoning_budget: int | None = None  # --reasoning-budget
    gateway: GatewayConfig | None = None  # --upstream, --blocklist, answer cache: only when one is on

    def __post_init__(self) -> None:
        from hearth.entrypoints.openai.reasoning_parser import get_parser

        get_parser(self.reasoning_parser)  # (an unknown name fails here, before any model loads)
        if self.reasoning_budget is not None and self.reasoning_parser is None:
            raise ValueError("--reasoning-budget needs --reasoning-parser (qwen3 or deepseek_r1)")

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> ServeOptions:
        from hearth import envs
        from hearth.entrypoints.openai.gateway import gateway_config_from

        gateway = gateway_config_from(ns, envs.upstream_api_key())
        return cls(ClientOptions(ns.max_waiting_requests, ns.refill_wait_ms / 1000), ns.reasoning_parser,
                   ns.reasoning_budget, gateway if gateway.enabled else None)

    def for_model(self, serving: dict) -> ServeOptions:
        """A --models-config entry's own reasoning-parser / reasoning-budget win over the flags."""
        return dataclasses.replace(self, **{k: serving[k] for k in SERVING_KEYS if k in serving})


@dataclass
class Serving:
    client: EngineClient
    ctx: ServingContext
    gateway: Gateway | None = None
    adapters: LoRAAdapters | None = None  # --enable-lora: the adapters served by name


def serving_context(client: EngineClient, opts: ServeOptions, name: str | None = None,
                    aliases: Sequence[str] = ()) -> ServingContext:
    """The context of a loaded model (client.info is set). Raises ValueError when the options do not fit the
    model (a reasoning budget without a </think> token)."""
    from hearth.entrypoints.openai.reasoning_parser import get_parser
    from hearth.entrypoints.openai.serving_common import ServingContext

    info = client.info
    ctx = ServingContext(client, info.tokenizer, name or info.served_model_name, info.model_path, info.max_model_len,
                         aliases=tuple(aliases), reasoning_parser=get_parser(opts.reasoning_parser),
                         reasoning_budget=opts.reasoning_budget)
    ctx.check_reasoning()  # (needs the vocabulary: only now)
    return ctx


def build_serving(llm: LLMEngine, opts: ServeOptions, lora_modules: Sequence[LoRAModule] = ()) -> Serving:
    """In process (`hearth serve MODEL`, a Ray replica): the client with its metrics, the context, the gateway, and
    with --enable-lora the adapters (lora_modules loaded now: a bad one fails here, before serving, with its
    LoRAError). The client is not started (the app's lifespan, or the replica, starts it)."""
    client = build_client(llm, opts.client)
    ctx = serving_context(client, opts)
    gateway = adapters = None
    if opts.gateway is not None:
        from hearth.entrypoints.openai.gateway import Gateway

        gateway = Gateway(opts.gateway, ctx, client.metrics.registry)
    if llm.lora is not None:
        from hearth.entrypoints.openai.errors import APIError
        from hearth.entrypoints.openai.lora_adapters import LoRAAdapters

        adapters = LoRAAdapters(ctx)
        for module in lora_modules:  # (the engine thread has not started: adding here is safe)
            try:
                lora = adapters.new_request(module)
            except APIError as e:
                raise ValueError(f"--lora-modules: {e.message}") from None
            llm.add_lora(lora)
            adapters.add(lora)
    return Serving(client, ctx, gateway, adapters)
