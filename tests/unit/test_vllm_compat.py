"""vLLM's command lines and Python snippets, with the program name swapped (issue 31)."""
import argparse
import os
import resource
import subprocess
import sys

import pytest

from hearth import vllm_compat
from hearth.entrypoints.cli import build_parser, engine_args_from

SERVE_LINE = ["serve", "/models/x.gguf", "--tensor-parallel-size", "1", "--pipeline-parallel-size", "1",
              "--enforce-eager", "--disable-log-stats", "--trust-remote-code", "--gpu-memory-utilization", "0.0"]


def _args(argv: list[str]):
    return engine_args_from(build_parser().parse_args(argv))


def test_vllm_serve_line_is_accepted_with_one_info_line_each(caplog) -> None:
    with caplog.at_level("INFO", logger="hearth"):
        args = _args(SERVE_LINE)
    assert args.model == "/models/x.gguf" and args.tensor_parallel_size == 1 and args.enforce_eager
    for line in ("accepted --enforce-eager (hearth has no CUDA graphs to skip)",
                 "accepted --gpu-memory-utilization (no GPU; the KV cache is --kv-cache-space GiB / "
                 "VLLM_CPU_KVCACHE_SPACE)",
                 "accepted --disable-log-stats (hearth logs no periodic stats; /metrics stays on)",
                 "accepted --trust-remote-code: hearth never runs a model's own Python code; the architecture must "
                 "be one hearth implements"):
        assert sum(r.getMessage() == line for r in caplog.records) == 1, line


def test_mapped_flags(caplog) -> None:
    with caplog.at_level("INFO", logger="hearth"):
        args = _args(["serve", "--model", "/m", "--dtype", "half", "--kv-cache-dtype", "fp8", "--device", "cpu",
                      "--swap-space", "4", "--block-size", "32", "--served-model-name", "gpt", "alias",
                      "--generation-config", "vllm"])
    assert (args.model, args.dtype, args.kv_cache_dtype, args.block_size) == ("/m", "bfloat16", "int8", 32)
    assert args.served_model_name == "gpt" and args.generation_config == "vllm"
    text = caplog.text
    assert "--dtype float16: hearth computes in bfloat16 on CPUs (as vLLM's CPU backend casts float16)" in text
    assert ("--kv-cache-dtype fp8: no fp8 KV cache on CPUs here; using int8 (the same bytes per element, per-token "
            "scales)") in text
    assert "accepted --device cpu (hearth always runs on the CPU)" in text
    assert "accepted --swap-space (preempted requests are recomputed, not swapped" in text
    for name, want in (("float", "float32"), ("float16", "bfloat16"), ("bfloat16", "bfloat16"), ("auto", "auto")):
        assert _args(["serve", "--dtype", name]).dtype == want


def test_values_hearth_cannot_honour_name_the_fix() -> None:
    with pytest.raises(ValueError) as e:
        _args(["serve", "--pipeline-parallel-size", "2"])
    assert str(e.value) == ("--pipeline-parallel-size 2: hearth has no pipeline parallelism; use "
                            "--pipeline-parallel-size 1 (and --tensor-parallel-size N to split a model over processes)")
    assert _args(["serve", "--tensor-parallel-size", "2"]).tensor_parallel_size == 2  # (hearth's own: distributed/)
    with pytest.raises(ValueError, match="two models given: 'a' and --model 'b'; give one"):
        _args(["serve", "a", "--model", "b"])


def test_cli_error_is_one_line_exit_2(capsys) -> None:
    from hearth.entrypoints.cli import main

    assert main(["serve", "--pipeline-parallel-size", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hearth serve: error: --pipeline-parallel-size 4: hearth has no pipeline parallelism")
    assert "\n" not in err


def test_engine_args_take_vllm_kwargs(caplog) -> None:
    from hearth import EngineArgs, LLM, SamplingParams  # noqa: F401 (vLLM's import line)

    with caplog.at_level("INFO", logger="hearth"):
        args = EngineArgs(model="/m", device="cpu", enforce_eager=True, swap_space=2, max_model_len=1024,
                          dtype="fp16", block_size=16)
    assert (args.dtype, args.max_model_len, args.block_size) == ("bfloat16", 1024, 16)
    assert callable(LLM.from_engine_args)
    assert EngineArgs(model="/m", quantization="bitsandbytes").quantization == "bitsandbytes"  # loads now
    with pytest.raises(ValueError, match="hearth runs on the CPU only"):
        EngineArgs(device="cuda")


def test_serve_help_groups_flags_and_shows_defaults(capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    out = capsys.readouterr().out
    for group in ("engine:", "sampling defaults:", "vLLM compatibility:", "server:"):
        assert group in out
    assert "(default: 8000)" in out and "(default: auto)" in out and "(default: 1)" in out


def test_generate_defaults_to_the_bundled_model() -> None:
    ns = build_parser().parse_args(["generate", "What is the capital of France?"])
    assert ns.model is None and ns.prompt == "What is the capital of France?"
    ns = build_parser().parse_args(["generate", "/m.gguf", "hi"])
    assert (ns.model, ns.prompt) == ("/m.gguf", "hi")


def test_help_and_version_do_not_import_torch() -> None:
    """`hearth --help` / `--version` under 0.5 s: no torch (~2 s of imports) before a command needs it. Timed in
    CPU seconds of the child, which a busy machine does not inflate the way it does wall time."""
    code = ("import sys; from hearth.entrypoints.cli import build_parser; build_parser(); "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:3]")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ})
    for flag in ("--help", "--version"):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run([sys.executable, "-m", "hearth.entrypoints.cli", flag], capture_output=True, text=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert done.returncode == 0, done.stderr
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        assert cpu < 0.5, (flag, cpu)


def test_omp_num_threads_sets_the_thread_count(monkeypatch) -> None:
    import torch

    from hearth.platform import setup_threads

    old = torch.get_num_threads()
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert setup_threads(None, "nobind") == (1, [])
        assert torch.get_num_threads() == 1
        assert setup_threads(2, "nobind")[0] == 2  # --threads wins
        monkeypatch.setenv("OMP_NUM_THREADS", "zero")
        with pytest.raises(ValueError, match="OMP_NUM_THREADS must be a positive integer, got 'zero'"):
            setup_threads(None, "nobind")
    finally:
        torch.set_num_threads(old)


def test_quantization_hook_is_one_place() -> None:
    # bitsandbytes loads now (tests/models/test_bitsandbytes.py), so nothing is refused with a pointer.
    assert vllm_compat.quantization_equivalent("bitsandbytes") is None
    assert vllm_compat.quantization_equivalent("int4") is None and vllm_compat.quantization_equivalent(None) is None


def test_api_server_modules_start_the_same_server() -> None:
    from hearth.entrypoints import api_server
    from hearth.entrypoints.openai import api_server as openai_api_server
    from hearth.entrypoints.openai import cli_serve

    assert api_server.main is cli_serve.main and openai_api_server.main is cli_serve.main
    p = argparse.ArgumentParser()
    cli_serve.add_serve_args(p)
    assert p.parse_args(["--model", "x", "--port", "1"]).model_flag == "x"
