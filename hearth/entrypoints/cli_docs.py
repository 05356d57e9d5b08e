"""docs/configuration.md from the code: every CLI flag of every subcommand and every environment variable in envs.py.

Regenerate with `python -m hearth.entrypoints.cli_docs > docs/configuration.md`; tests/unit/test_config_docs.py
fails when the file and the code disagree, so the table cannot drift.
"""
from __future__ import annotations

import argparse
import ast
import inspect
import os
import re
import sys
from dataclasses import dataclass, field
from unittest import mock

REGENERATE = "python -m hearth.entrypoints.cli_docs > docs/configuration.md"
_VARIABLE = re.compile(r"^(HEARTH|VLLM|OMP)_[A-Z0-9_]+$")


@dataclass
class Row:
    name: str
    default: str
    description: str
    commands: list[str] = field(default_factory=list)


def _cell(text: str) -> str:
    """One markdown table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _flag_default(action: argparse.Action) -> str:
    if isinstance(action, argparse._StoreTrueAction):
        return "off"
    if isinstance(action, argparse._StoreFalseAction):
        return "on"
    if action.default in (None, argparse.SUPPRESS):
        return "-"
    return f"`{action.default}`"


def _flag_name(action: argparse.Action) -> str:
    if action.option_strings:
        name = ", ".join(f"`{s}`" for s in action.option_strings)
        takes_value = action.nargs != 0
        if takes_value and action.choices:
            name += " " + " | ".join(str(c) for c in action.choices)
        elif takes_value:
            name += f" {action.metavar or action.dest.upper()}"
        return name
    return f"`{action.metavar or action.dest.upper()}` (positional)"


def _help(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    if "%(" in text:  # argparse's own placeholders, as --help would print them
        text = text % {**vars(action), "prog": prog}
    return text


def _walk(parser: argparse.ArgumentParser, command: list[str], rows: dict[tuple[str, str, str], Row]) -> None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                _walk(sub, [*command, name], rows)
            continue
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        row = Row(_flag_name(action), _flag_default(action), _help(action, parser.prog))
        # A flag shared by several subcommands with the same default and meaning (the engine's) is one row.
        key = (row.name, row.default, row.description)
        rows.setdefault(key, row).commands.append(" ".join(command))


def flag_rows() -> list[Row]:
    from hearth.entrypoints.cli import build_parser

    rows: dict[tuple[str, str, str], Row] = {}
    _walk(build_parser(), [], rows)
    return list(rows.values())


def _variables(function) -> list[str]:
    """The HEARTH_* / VLLM_* / OMP_* names an envs.py function reads (the string constants in its body)."""
    tree = ast.parse(inspect.getsource(function))
    names = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return list(dict.fromkeys(n for n in names if _VARIABLE.match(n)))


def _env_default(name: str, value: object) -> str:
    if isinstance(value, bool):
        return "`1` (on)" if value else "`0` (off)"
    if value is None:
        return "-"
    if isinstance(value, int) and name.endswith("_bytes") and value % (1 << 30) == 0:
        return f"`{value >> 30}` (GiB)"  # the variable is read in GiB, the function returns bytes
    return f"`{value}`"


def env_rows(flags: list[Row]) -> list[Row]:
    from hearth import envs

    rows = []
    for name, function in inspect.getmembers(envs, inspect.isfunction):
        if name.startswith("_") or function.__module__ != envs.__name__:
            continue
        if any(p.default is inspect.Parameter.empty for p in inspect.signature(function).parameters.values()):
            continue
        variables = _variables(function)
        if not variables:
            continue
        # The default is what the function returns in an environment without any of hearth's variables; the cache
        # root is shown as the variable it comes from, not this machine's home directory.
        clean = {k: v for k, v in os.environ.items() if not _VARIABLE.match(k)}
        clean["XDG_CACHE_HOME"] = "$XDG_CACHE_HOME"
        with mock.patch.dict(os.environ, clean, clear=True):
            default = _env_default(name, function())
        primary = [v for v in variables if v.startswith("HEARTH_")] or variables[:1]
        aliases = [v for v in variables if v not in primary]
        for variable in primary:
            label = f"`{variable}`" + (f" (alias {', '.join(f'`{a}`' for a in aliases)})" if aliases else "")
            rows.append(Row(label, default, inspect.getdoc(function) or _flag_for(variable, flags), ["environment"]))
    return sorted(rows, key=lambda r: r.name.split("`")[1])


def _flag_for(variable: str, flags: list[Row]) -> str:
    """An undocumented variable's meaning: the flag whose help names it."""
    names = sorted({r.name.split("`")[1] for r in flags if variable in r.description})
    return f"what {' / '.join(f'`{n}`' for n in names)} sets" if names else ""


def render() -> str:
    lines = [
        "# Configuration",
        "",
        "Every flag of every `hearth` subcommand and every environment variable hearth reads, with its default.",
        "Flag and variable names follow vLLM's where they mean the same thing; a flag beats its variable.",
        "`$XDG_CACHE_HOME` defaults to `~/.cache`. Run `hearth <command> --help` for the same text per command.",
        "",
        f"This file is generated from the code: `{REGENERATE}`.",
        "",
        "| flag or variable | default | where | what it does |",
        "|---|---|---|---|",
    ]
    flags = flag_rows()
    for row in [*flags, *env_rows(flags)]:
        where = ", ".join(f"`{c}`" if c != "environment" else c for c in row.commands)
        lines.append(f"| {_cell(row.name)} | {_cell(row.default)} | {where} | {_cell(row.description)} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
