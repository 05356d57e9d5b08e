"""Command-line flags declared as dataclass fields, as vLLM's engine/arg_utils.py derives its CLI from EngineArgs.

    block_size: int = arg(16, "tokens per KV-cache block", group="engine", vllm=SAME)

One declaration gives the field and its default, the argparse flag (add_args), `--help`, docs/configuration.md
(entrypoints/cli_docs.py walks the parsers) and the vLLM flag mapping (vllm_flags). Standard library only: the
CLI builds its parsers without importing torch.
"""
from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

# How a flag relates to vLLM's flag of the same name (Arg.vllm; None: hearth's own, vLLM has no such flag).
SAME = "same"  # vLLM's flag, the same meaning
MAPPED = "mapped"  # vLLM's flag; some values mean the closest thing a CPU has (one log line says what)
NOOP = "no-op"  # vLLM's flag, accepted so its command lines run; nothing to do on a CPU (one info line)


@dataclass(frozen=True)
class Arg:
    help: str
    group: str
    flags: tuple[str, ...] = ()  # option strings; () means --<field-name-with-dashes>
    choices: tuple[str, ...] | None = None
    type: Callable[[str], Any] | None = None  # None: int / float from the annotation, else the string itself
    action: str | None = None  # "store_true" | "store_false" (then no type or choices)
    nargs: str | None = None
    metavar: str | None = None
    # A positional argument; `flags` then name its optional form too (as vLLM's --model), stored in <name>_flag.
    positional: bool = False
    vllm: str | None = None  # SAME | MAPPED | NOOP | None


def arg(default: Any = dataclasses.MISSING, help: str = "", *, group: str,
        default_factory: Any = dataclasses.MISSING, **spec: Any) -> Any:
    """A dataclass field that is also a command-line flag (the keywords of Arg)."""
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={"arg": Arg(help, group, **spec)})


def arg_fields(cls: type) -> list[tuple[dataclasses.Field, Arg]]:
    """cls's fields that are flags, in declaration order."""
    return [(f, f.metadata["arg"]) for f in dataclasses.fields(cls) if "arg" in f.metadata]


def flag_names(f: dataclasses.Field, a: Arg) -> tuple[str, ...]:
    return a.flags or ("--" + f.name.replace("_", "-"),)


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _type_of(annotation: str) -> Callable[[str], Any] | None:
    """int or float from an annotation such as 'int | None' (a string under `from __future__ import annotations`)."""
    parts = {p.strip() for p in str(annotation).split("|")}
    return int if "int" in parts else float if "float" in parts else None


def _kwargs(f: dataclasses.Field, a: Arg) -> dict[str, Any]:
    kw: dict[str, Any] = {"default": _default(f), "help": a.help}
    if a.action:
        kw["action"] = a.action
        return kw
    kind = a.type or _type_of(f.type)
    if kind is not None:
        kw["type"] = kind
    for key in ("choices", "nargs", "metavar"):
        value = getattr(a, key)
        if value is not None:
            kw[key] = list(value) if key == "choices" else value
    return kw


def _group(p: argparse.ArgumentParser, title: str, descriptions: dict[str, str]) -> argparse._ArgumentGroup:
    for g in p._action_groups:  # (argparse has no lookup by title; a second class may add to the same group)
        if g.title == title:
            return g
    return p.add_argument_group(title, descriptions.get(title))


def add_args(p: argparse.ArgumentParser, classes: Iterable[type], descriptions: dict[str, str] | None = None,
             overrides: dict[str, dict[str, Any]] | None = None, groups: Iterable[str] | None = None) -> None:
    """Every flag field of `classes` onto p, each in its argument group (titles in the order they first appear;
    descriptions: a group's line under its title). overrides: per-field argparse keywords for this parser (a
    default that differs by command). groups: only these groups' flags."""
    descriptions, overrides = descriptions or {}, overrides or {}
    wanted = None if groups is None else set(groups)
    for cls in classes:
        for f, a in arg_fields(cls):
            if wanted is not None and a.group not in wanted:
                continue
            kw = {**_kwargs(f, a), **overrides.get(f.name, {})}
            if a.positional:
                p.add_argument(f.name, **kw)
                if a.flags:
                    _group(p, a.group, descriptions).add_argument(
                        *a.flags, dest=f"{f.name}_flag", default=None, metavar=f.name.upper(),
                        help=f"the {f.name}, as vLLM's {a.flags[0]} (instead of the positional {f.name.upper()})")
                continue
            _group(p, a.group, descriptions).add_argument(*flag_names(f, a), dest=f.name, **kw)


def vllm_flags(classes: Iterable[type]) -> dict[str, tuple[str, str]]:
    """vLLM's flag -> (how hearth takes it: SAME | MAPPED | NOOP, the field it sets), for every field marked vllm."""
    out: dict[str, tuple[str, str]] = {}
    for cls in classes:
        for f, a in arg_fields(cls):
            if a.vllm is None:
                continue
            for flag in (a.flags if a.positional else flag_names(f, a)):
                out[flag] = (a.vllm, f.name)
    return out
