"""docs/configuration.md is generated from the code; this fails when a flag or variable changes without it, or when a
flag is declared anywhere but its dataclass field (EngineArgs, ServerArgs)."""
import argparse
import dataclasses
from pathlib import Path

from hearth.arg_fields import Arg, arg_fields, flag_names
from hearth.engine_args import EngineArgs
from hearth.entrypoints import cli_docs
from hearth.entrypoints.openai.serve_args import ServerArgs, vllm_flag_mapping

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_configuration_doc_matches_the_code():
    assert DOC.read_text() == cli_docs.render(), (
        f"docs/configuration.md is out of date with the CLI flags or hearth/envs.py; regenerate it with "
        f"`{cli_docs.REGENERATE}`")


def test_every_flag_and_variable_is_listed():
    text = cli_docs.render()
    for name in ("`--max-num-seqs`", "`--api-key-file`", "`--input-len`", "`HEARTH_QUANT_ACT`",
                 "`HEARTH_KVCACHE_SPACE` (alias `VLLM_CPU_KVCACHE_SPACE`)"):
        assert name in text
    # The shared engine flags are one row naming every command that takes them, with the per-command defaults apart.
    assert text.count("`--max-prefills-per-decode-step`") == 2


# ---- one declaration: `hearth serve --help`, this file and the vLLM flag mapping all come from the dataclass fields

def _serve_parser() -> argparse.ArgumentParser:
    """`hearth serve`'s parser as the CLI builds it."""
    from hearth.entrypoints.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["serve"]


def _declared() -> list[tuple[dataclasses.Field, Arg]]:
    return arg_fields(EngineArgs) + arg_fields(ServerArgs)


def test_serve_flags_are_exactly_the_declared_fields() -> None:
    """Every `hearth serve` flag comes from an EngineArgs or ServerArgs field, with the field's names and default:
    a flag added beside the declaration, or a default repeated and changed, fails here."""
    actions = {a.dest: a for a in _serve_parser()._actions if not isinstance(a, argparse._HelpAction)}
    declared = _declared()
    assert set(actions) == {f.name for f, _ in declared} | {"model_flag"}
    overridden = {"max_prefills_per_decode_step": 1}  # (the server staggers prompts: add_serve_args)
    for f, a in declared:
        action = actions[f.name]
        want = f.default_factory() if f.default is dataclasses.MISSING else f.default
        assert action.default == overridden.get(f.name, want), f.name
        if not a.positional:
            assert tuple(action.option_strings) == flag_names(f, a), f.name
        assert (action.choices is None) == (a.choices is None or a.action is not None), f.name
    assert actions["model_flag"].option_strings == ["--model"] and actions["model"].nargs == "?"


def test_help_docs_and_vllm_mapping_come_from_the_declarations() -> None:
    help_text = _serve_parser().format_help()
    doc = DOC.read_text()
    for f, a in _declared():
        for flag in (a.flags if a.positional else flag_names(f, a)):
            assert flag in help_text and f"`{flag}`" in doc, flag
    mapping = vllm_flag_mapping()
    marked = {f.name for f, a in _declared() if a.vllm is not None}
    assert {name for _, name in mapping.values()} == marked
    for flag, (how, name) in mapping.items():
        assert flag in help_text and f"| `{flag}` | {how} | `{name}` |" in doc, flag


def test_every_vllm_flag_reaches_its_field() -> None:
    """Each vLLM flag of the mapping parses in `hearth serve` into the field it names, and a vLLM line of all of them
    builds EngineArgs (mapped values mapped, no-ops accepted)."""
    from hearth.entrypoints.cli import engine_args_from

    parser = _serve_parser()
    by_flag = {s: a for a in parser._actions for s in a.option_strings}
    line = []
    for flag, (_, name) in vllm_flag_mapping().items():
        action = by_flag[flag]
        assert action.dest in (name, f"{name}_flag"), flag
        if action.nargs == 0:
            values = []
        elif action.choices:
            values = [next(c for c in action.choices if c != action.default)]
        else:
            values = ["2" if action.type in (int, float) else "x"]
        ns = parser.parse_args([flag, *values])
        assert getattr(ns, action.dest) != action.default, flag
        if flag.startswith("--") and flag not in ("--pipeline-parallel-size", "--dtype", "--kv-cache-dtype",
                                                 "--device", "--task", "--quantization", "--runner"):
            line += [flag, *values]  # (those take their defaults below: some of their values are refused)
    args = engine_args_from(parser.parse_args(line))
    assert args.model == "x" and args.served_model_name == "x" and args.enforce_eager and args.tensor_parallel_size == 2
