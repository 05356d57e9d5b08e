"""`hearth serve` with several models (--models-dir, --models-config and the budget) or data parallelism
(--data-parallel-size), flags declared in serve_args.ServerArgs: both run engines in worker processes behind a
ModelRouter. `hearth serve MODEL` without them keeps its in-process engine (no process hop on the token path)."""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the router imports torch, which `hearth serve --help` must not
    from hearth.config import EngineArgs
    from hearth.entrypoints.openai.model_router import ModelRouter, RouterConfig
    from hearth.entrypoints.openai.model_specs import ModelSpec
    from hearth.entrypoints.openai.serving_build import ServeOptions


def build_router(ns: argparse.Namespace) -> ModelRouter | None:
    """The router the flags ask for, or None for the plain in-process `hearth serve MODEL`."""
    from hearth.entrypoints.openai.model_router import ModelRouter
    from hearth.entrypoints.openai.serving_build import ServeOptions

    parts = router_parts(ns, ServeOptions.from_namespace(ns))
    return ModelRouter(*parts) if parts is not None else None


def router_parts(ns: argparse.Namespace, serve: ServeOptions
                 ) -> tuple[list[ModelSpec], EngineArgs, RouterConfig] | None:
    """What a ModelRouter is built from (its models, their base EngineArgs, its config with every model's serving
    options), or None for the plain in-process `hearth serve MODEL`. Raises ValueError on bad values."""
    from hearth import envs
    from hearth.engine.core_slots import core_slots, slot_count
    from hearth.distributed.dp_cores import dp_core_sets
    from hearth.entrypoints.cli import engine_args_from
    from hearth.entrypoints.openai.model_router import RouterConfig
    from hearth.entrypoints.openai.model_specs import ModelSpec, check_names, specs_from_dir, specs_from_toml

    multi = ns.models_dir is not None or ns.models_config is not None
    if ns.data_parallel_size < 1:
        raise ValueError(f"--data-parallel-size must be >= 1, got {ns.data_parallel_size}")
    if not multi and ns.data_parallel_size == 1:
        for flag in ("max_loaded_models", "models_memory", "idle_unload_seconds"):
            if getattr(ns, flag) is not None:
                raise ValueError(f"--{flag.replace('_', '-')} needs --models-dir or --models-config")
        return None
    base = engine_args_from(ns)
    if multi and base.model is not None:
        raise ValueError("pass either MODEL (or --model) or --models-dir / --models-config, not both")
    if multi and base.served_model_name is not None:
        raise ValueError("--served-model-name names one model: with --models-dir / --models-config each model is "
                         "named by its file, folder or entry")
    for flag in ("max_loaded_models", "models_memory", "idle_unload_seconds", "model_load_timeout"):
        value = getattr(ns, flag)
        if value is not None and value <= 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be > 0, got {value}")
    if multi:
        specs = []
        if ns.models_dir is not None:
            specs += specs_from_dir(ns.models_dir)
        if ns.models_config is not None:
            config_specs = specs_from_toml(ns.models_config)
            names = {s.name for s in config_specs}
            specs = [s for s in specs if s.name not in names] + config_specs  # the config's entry wins
        check_names(specs)
        check_serving(specs, ns)
    else:
        from hearth.loader.model_loader import default_model_path

        import os

        path = base.model or default_model_path()
        # NOTE: the loader's own default name (model_loader), so the API name is the same as without -dp
        name = base.served_model_name or os.path.basename(os.path.normpath(path)).removesuffix(".gguf")
        specs = [ModelSpec(name, path, pinned=True)]
    bind = ns.omp_threads_bind or envs.omp_threads_bind()
    if multi:  # the cores are split between the models that may be resident (hearth.engine.core_slots)
        slots = core_slots(slot_count(len(specs), ns.max_loaded_models, ns.data_parallel_size),
                           ns.data_parallel_size, bind, ns.threads)
    else:
        slots = [list(dp_core_sets(ns.data_parallel_size, bind, ns.threads))]
    config = RouterConfig(ns.max_loaded_models, ns.models_memory, ns.idle_unload_seconds, ns.model_load_timeout,
                          ns.data_parallel_size, slots, ns.drain_timeout, serve)
    return specs, base, config


def check_serving(specs: list, ns: argparse.Namespace) -> None:
    """A model's reasoning-parser / reasoning-budget (its TOML entry, else the flag) fail now, not at its load."""
    from hearth.entrypoints.openai.reasoning_parser import get_parser

    for s in specs:
        parser = s.serving.get("reasoning_parser", ns.reasoning_parser)
        budget = s.serving.get("reasoning_budget", ns.reasoning_budget)
        where = f"model {s.name!r}"
        try:
            get_parser(parser)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
            raise ValueError(f"{where}: reasoning-budget must be a whole number >= 0, got {budget!r}")
        if budget is not None and parser is None:
            raise ValueError(f"{where}: reasoning-budget needs reasoning-parser (qwen3 or deepseek_r1)")
