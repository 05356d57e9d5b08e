"""`hearth serve | generate | chat | bench | doctor`. Flag names follow vLLM's where they mean the same thing.

CLI errors are one line naming the fix (no traceback): ValueError/LoadError from config and loading are caught here.
"""
from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from hearth import __version__

if TYPE_CHECKING:
    from hearth.engine_args import EngineArgs


def add_engine_args(p: argparse.ArgumentParser, model_optional: bool = False, max_prefills_per_step: int = 0) -> None:
    """The engine's flags, generated from EngineArgs' fields (hearth/engine_args.py). max_prefills_per_step: the
    --max-prefills-per-decode-step default (the server staggers prompts; offline runs take a batch in as few steps
    as the budget allows)."""
    from hearth.arg_fields import add_args
    from hearth.engine_args import GROUP_DESCRIPTIONS, EngineArgs

    overrides: dict[str, dict] = {"max_prefills_per_decode_step": {"default": max_prefills_per_step}}
    if model_optional:
        overrides["model"] = {"nargs": "?", "help": "HF model folder or .gguf file; None: the bundled "
                                                    "SmolLM2-135M-Instruct"}
    add_args(p, [EngineArgs], GROUP_DESCRIPTIONS, overrides)


def engine_args_from(ns: argparse.Namespace) -> EngineArgs:
    """EngineArgs from parsed flags: every EngineArgs field the namespace holds (vLLM's --model instead of the
    positional MODEL; --task and a list of served names are mapped by vllm_compat.normalize)."""
    import dataclasses

    from hearth.engine_args import EngineArgs

    kwargs = {f.name: getattr(ns, f.name) for f in dataclasses.fields(EngineArgs) if hasattr(ns, f.name)}
    flag = getattr(ns, "model_flag", None)
    if flag is not None:
        if kwargs.get("model") not in (None, flag):
            raise ValueError(f"two models given: {kwargs['model']!r} and --model {flag!r}; give one")
        kwargs["model"] = flag
    return EngineArgs(**kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hearth", description="CPU-first LLM inference and serving")
    parser.add_argument("--version", action="version", version=f"hearth {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    from hearth.entrypoints.openai import cli_serve

    cli_serve.register(sub)
    from hearth.entrypoints import cli_generate

    cli_generate.register(sub)
    try:
        from hearth.benchmarks import cli_bench

        cli_bench.register(sub)
    except ImportError:
        pass
    from hearth.entrypoints import cli_doctor

    cli_doctor.register(sub)
    from hearth.entrypoints import cli_ps

    cli_ps.register(sub)
    from hearth.entrypoints import cli_keys

    cli_keys.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s %(message)s", datefmt="%H:%M:%S")
    from hearth.errors import LoadError

    command = "hearth"
    try:
        parser = build_parser()
        ns = parser.parse_args(argv)
        command = f"hearth {ns.command}"
        return int(ns.func(ns) or 0)
    except (ValueError, LoadError, FileNotFoundError) as e:
        print(f"{command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
