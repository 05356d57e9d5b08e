"""The CLI as a user runs it: real subprocesses, one-line errors, exit codes."""
import subprocess
import sys

import pytest

from tests.tiny_models import build_checkpoint, tiny_config


def hearth(*args: str, stdin: str | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hearth.entrypoints.cli", *args], input=stdin, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return build_checkpoint(str(tmp_path_factory.mktemp("cli") / "tiny"), tiny_config("llama"))


def test_missing_model_is_one_line_naming_the_fix():
    r = hearth("generate", "org/some-model", "hi")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "never downloads" in lines[0] and "Traceback" not in r.stderr


def test_bad_flag_value_is_one_line():
    r = hearth("generate", "x", "hi", "--temperature", "-1")
    assert r.returncode == 2 and "temperature" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("variable, value, accepted", [("HEARTH_QUANT_ACT", "int4", "int8x2, int8 or float"),
                                                      ("HEARTH_QUANT_GEMM", "maybe", "auto, 1 or 0"),
                                                      ("HEARTH_PANELS", "of", "1 or 0"),
                                                      # (read at hearth's import too, to limit torch's kernels)
                                                      ("HEARTH_KERNELS_ISA", "sse4", "auto, avx2 or avx512")])
def test_bad_environment_value_is_one_line_naming_the_accepted_values(variable, value, accepted):
    """Read when the kernel modules load (before the command runs): still one line, not the default in silence."""
    import os

    r = subprocess.run([sys.executable, "-m", "hearth.entrypoints.cli", "doctor"], capture_output=True, text=True,
                       timeout=240, env={**os.environ, variable: value})
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert variable in lines[0] and accepted in lines[0] and repr(value) in lines[0]


def test_generate_prints_text(tiny):
    r = hearth("generate", tiny, "The quick brown fox", "--max-tokens", "8", "--kv-cache-space", "0.05")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()


def test_chat_reads_turns_until_empty_line(tiny):
    r = hearth("chat", tiny, "--max-tokens", "4", "--kv-cache-space", "0.05", stdin="hello\nand again\n\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("> ") >= 3  # two answered turns, then the prompt that got the empty line


def test_doctor_reports_isa():
    r = hearth("doctor")
    assert r.returncode == 0 and "isa" in r.stdout and "physical cores" in r.stdout
    from hearth.weights import dispatch

    # the layout table, printed from dispatch.table(): every layout, the kernel plan() picks per row count
    lines = r.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("weight layout"))
    printed = {line.split()[0]: line.split()[1:] for line in lines[start + 1:] if line.strip()}
    assert printed == {name: kernels for name, _, kernels in dispatch.table()}


def test_server_staggers_prompts_by_default_offline_runs_do_not():
    from hearth.entrypoints.cli import build_parser

    parser = build_parser()
    serve = parser.parse_args(["serve", "m"])
    assert serve.max_prefills_per_decode_step == 1 and serve.refill_wait_ms > 0
    assert parser.parse_args(["serve", "m", "--max-prefills-per-decode-step", "0"]).max_prefills_per_decode_step == 0
    assert parser.parse_args(["generate", "m", "hi"]).max_prefills_per_decode_step == 0
