"""docs/configuration.md is generated from the code; this fails when a flag or variable changes without it."""
from pathlib import Path

from hearth.entrypoints import cli_docs

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
