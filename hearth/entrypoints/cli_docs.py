"""docs/configuration.md from the code: every CLI flag of every subcommand and every variable of envs.VARIABLES.

Regenerate with `python -m hearth.entrypoints.cli_docs > docs/configuration.md`; tests/unit/test_config_docs.py
fails when the file and the code disagree, so the table cannot drift.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

REGENERATE = "python -m hearth.entrypoints.cli_docs > docs/configuration.md"


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


def _env_default(var) -> str:
    if var.shown_default is not None:
        return f"`{var.shown_default}`"
    if isinstance(var.default, bool):
        return "`1` (on)" if var.default else "`0` (off)"
    return "-" if var.default is None else f"`{var.default}`"


def env_rows() -> list[Row]:
    """One row per variable of envs.VARIABLES, by name."""
    from hearth import envs

    rows = []
    for var in envs.VARIABLES.values():
        label = f"`{var.name}`" + (f" (alias {', '.join(f'`{a}`' for a in var.aliases)})" if var.aliases else "")
        rows.append(Row(label, _env_default(var), var.doc, ["environment"]))
    return sorted(rows, key=lambda r: r.name.split("`")[1])


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
    for row in [*flag_rows(), *env_rows()]:
        where = ", ".join(f"`{c}`" if c != "environment" else c for c in row.commands)
        lines.append(f"| {_cell(row.name)} | {_cell(row.default)} | {where} | {_cell(row.description)} |")
    return "\n".join([*lines, *vllm_lines()]) + "\n"


def vllm_lines() -> list[str]:
    """The vLLM flag mapping (serve_args.vllm_flag_mapping, from the same declarations as the flags above)."""
    from hearth.entrypoints.openai.serve_args import vllm_flag_mapping

    lines = [
        "",
        "## vLLM's flags",
        "",
        "`vllm serve` command lines run with the program renamed: `hearth serve` accepts every vLLM flag below.",
        "same: the same meaning; mapped: some values become the closest thing a CPU has, or are refused with the fix "
        "(a log line says which); no-op: accepted, nothing to do on a CPU (an info line says so).",
        "",
        "| vLLM flag | in hearth | sets |",
        "|---|---|---|",
    ]
    for flag, (how, name) in sorted(vllm_flag_mapping().items(), key=lambda kv: kv[0].lstrip("-").lower()):
        lines.append(f"| `{flag}` | {how} | `{name}` |")
    return lines


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
