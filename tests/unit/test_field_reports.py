"""Every line of the field reports that issue 51 lists, with the program name swapped: each works or prints its
one-line note, none raises. docs/vllm-drop-in.md's "Lines from the field reports" table points here; the lines
vLLM itself has (the seed's launch line, EngineArgs(device="cpu", swap_space=2), api_server) are in
tests/unit/test_vllm_compat.py."""
from __future__ import annotations

import logging
import os
import shutil

import pytest
import torch

from hearth import LLM, EngineArgs, SamplingParams
from hearth.engine import kv_dtype
from hearth.entrypoints.cli import build_parser, engine_args_from
from hearth.errors import LoadError
from hearth.loader.model_loader import default_model_path
from hearth.platform import CPUInfo
from tests.tiny_models import build_checkpoint, tiny_config
from tests.unit.test_vllm_compat import SERVE_LINE

hearth_logger = logging.getLogger("hearth")


@pytest.fixture(autouse=True)
def _restore_log_level():
    level = hearth_logger.level
    yield
    hearth_logger.setLevel(level)


def _messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def _serve(argv: list[str]) -> EngineArgs:
    return engine_args_from(build_parser().parse_args(["serve", "/models/x.gguf", *argv]))


@pytest.fixture(scope="module")
def float_model(tmp_path_factory) -> str:
    return build_checkpoint(str(tmp_path_factory.mktemp("field") / "float"),
                            tiny_config("llama", hidden_size=128, intermediate_size=256, num_hidden_layers=2))


def _layouts(llm: LLM) -> set[str]:
    from hearth.layers.quant_linear import QuantLinear
    from hearth.weights import layouts

    return {layouts.of(m.qweight).name for m in llm.engine.model.modules()
            if isinstance(m, QuantLinear) and m.qweight is not None}


# LLM(model=..., quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_use_double_quant=True,
#     bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32), device="cpu")
def test_bitsandbytes_config_loads_nf4_at_load(float_model: str, caplog) -> None:
    from transformers import BitsAndBytesConfig

    folder = float_model
    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_use_double_quant=True, bnb_4bit_quant_type="nf4",
                                bnb_4bit_compute_dtype=torch.float32)
    with caplog.at_level("INFO", logger="hearth"):
        llm = LLM(model=folder, quantization_config=config, device="cpu", kv_cache_space=0.05)
    assert llm.engine.args.quantization == "bitsandbytes" and llm.engine.model_config.dtype == torch.float32
    assert _layouts(llm) == {"nf4"}
    assert any(m.startswith("quantization_config: 4-bit NF4 at load") for m in _messages(caplog))
    out = llm.generate([{"prompt_token_ids": [5, 17, 42]}], SamplingParams(temperature=0.0, max_tokens=4,
                                                                           ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4


def test_bitsandbytes_config_8bit(float_model: str, tmp_path) -> None:
    """load_in_8bit: a float checkpoint gets int8 rows at load; an LLM.int8 checkpoint saved by transformers loads
    as saved (the config agrees with it)."""
    from transformers import BitsAndBytesConfig

    eight = BitsAndBytesConfig(load_in_8bit=True)
    assert _layouts(LLM(float_model, quantization_config=eight, kv_cache_space=0.05)) == {"int8"}
    pytest.importorskip("bitsandbytes")
    from transformers import AutoModelForCausalLM

    saved = str(tmp_path / "int8")
    AutoModelForCausalLM.from_pretrained(float_model, quantization_config=eight, device_map="cpu",
                                         dtype=torch.float32).save_pretrained(saved)
    for name in os.listdir(float_model):
        if name.startswith("tokenizer") or name == "special_tokens_map.json":
            shutil.copy(os.path.join(float_model, name), saved)
    assert _layouts(LLM(saved, quantization_config=eight, kv_cache_space=0.05)) == {"int8"}


def test_bitsandbytes_config_forms_and_refusals() -> None:
    from transformers import BitsAndBytesConfig

    as_dict = EngineArgs(model="/m", quantization_config={"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                                          "bnb_4bit_compute_dtype": "bfloat16"})
    assert (as_dict.quantization, as_dict.dtype, as_dict.quantization_config) == ("bitsandbytes", "bfloat16", None)
    assert EngineArgs(model="/m", quantization_config=BitsAndBytesConfig(load_in_8bit=True)).quantization == "int8"
    for config, field in ((BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="fp4"), "bnb_4bit_quant_type"),
                          (BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=["lm_head"]),
                           "llm_int8_skip_modules"),
                          ({"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_blocksize": 32},
                           "bnb_4bit_blocksize")):
        with pytest.raises(ValueError, match=f"quantization_config.{field}") as e:
            EngineArgs(model="/m", quantization_config=config)
        assert "\n" not in str(e.value)
    with pytest.raises(LoadError, match="a GGUF file is already quantized"):
        LLM(default_model_path(), quantization_config={"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"})


# SamplingParams(temperature=0.7, top_p=0.8, max_tokens=512, batch_size=1)
def test_sampling_params_batch_size_is_a_note(caplog) -> None:
    with caplog.at_level("INFO", logger="hearth"):
        params = SamplingParams(temperature=0.7, top_p=0.8, max_tokens=512, batch_size=1)
    assert (params.temperature, params.top_p, params.max_tokens) == (0.7, 0.8, 512)
    assert any(m.startswith("SamplingParams(batch_size=1) accepted and ignored: continuous batching")
               for m in _messages(caplog))
    with pytest.raises(TypeError, match="'top_pp'; did you mean 'top_p'"):
        SamplingParams(top_pp=0.8)


# hearth serve ... --debug; --log-level debug; VLLM_LOGGING_LEVEL=DEBUG
@pytest.mark.parametrize("argv, env", [(["--debug"], None), (["--log-level", "debug"], None), ([], "DEBUG")])
def test_debug_logging(argv: list[str], env: str | None, monkeypatch) -> None:
    monkeypatch.delenv("HEARTH_LOGGING_LEVEL", raising=False)
    if env:
        monkeypatch.setenv("VLLM_LOGGING_LEVEL", env)
    hearth_logger.setLevel(logging.NOTSET)
    _serve(argv)
    assert hearth_logger.getEffectiveLevel() == logging.DEBUG


def test_hearth_serve_debug_sets_the_level(monkeypatch) -> None:
    """`hearth serve MODEL --debug`: its own parser and plan (in process), as its main builds them."""
    import argparse

    from hearth.entrypoints.openai.serve_args import add_serve_args
    from hearth.entrypoints.openai.serve_plan import plan_serve

    monkeypatch.delenv("HEARTH_LOGGING_LEVEL", raising=False)
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    hearth_logger.setLevel(logging.NOTSET)
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    plan_serve(parser.parse_args(["/models/x.gguf", "--debug"]))
    assert hearth_logger.getEffectiveLevel() == logging.DEBUG


# --kv-cache-dtype float16 --num-gpu-blocks 0 --cpu-kv-cache with VLLM_CPU_KV_CACHE=1; export VLLM_CPU_ONLY=1
# VLLM_NO_CUDA=1
def test_kv_cache_flags_and_noop_variables_parse(monkeypatch, caplog) -> None:
    for name in ("VLLM_CPU_KV_CACHE", "VLLM_CPU_ONLY", "VLLM_NO_CUDA"):
        monkeypatch.setenv(name, "1")
    with caplog.at_level("INFO", logger="hearth"):
        args = _serve(["--kv-cache-dtype", "float16", "--num-gpu-blocks", "0", "--cpu-kv-cache"])
    assert args.kv_cache_dtype == "float16"
    text = "\n".join(_messages(caplog))
    for what in ("accepted --num-gpu-blocks", "accepted --cpu-kv-cache", "accepted VLLM_CPU_KV_CACHE=1",
                 "accepted VLLM_CPU_ONLY=1", "accepted VLLM_NO_CUDA=1"):
        assert what in text, what
    for dtype in ("bfloat16", "float32"):
        assert _serve(["--kv-cache-dtype", dtype]).kv_cache_dtype == dtype


def test_float_kv_cache_dtype_falls_back_with_a_line(monkeypatch, caplog) -> None:
    assert kv_dtype.kv_cache_dtype("float32", torch.float32) == torch.float32
    assert kv_dtype.kv_cache_dtype("int8", torch.float32) == torch.int8
    no_bf16 = CPUInfo("a CPU without bf16", frozenset({"avx2", "fma"}), 2, 1)
    monkeypatch.setattr(kv_dtype, "cpu_info", lambda: no_bf16)
    with caplog.at_level("WARNING", logger="hearth"):
        assert kv_dtype.kv_cache_dtype("bfloat16", torch.float32) == torch.float32
        assert kv_dtype.kv_cache_dtype("float16", torch.bfloat16) == torch.bfloat16
    assert any("no native bf16" in m for m in _messages(caplog))
    assert any("no float16 attention" in m for m in _messages(caplog))


# import hearth.platforms; hearth.platforms.current_platform = hearth.platforms.CpuPlatform()
# from hearth.platforms import register_platform; register_platform("cpu")
def test_platforms_lines(caplog) -> None:
    import hearth.platforms

    hearth.platforms.current_platform = hearth.platforms.CpuPlatform()
    assert hearth.platforms.current_platform.is_cpu() and hearth.platforms.current_platform.isa
    from hearth.platforms import register_platform

    with caplog.at_level("INFO", logger="hearth"):
        assert register_platform("cpu").device_type == "cpu"
    assert any(m.startswith("register_platform('cpu'): accepted") for m in _messages(caplog))
    with pytest.raises(ValueError, match="CPU only"):
        register_platform("cuda")


# os.environ["VLLM_CPU_MAX_MODEL_LEN"] = "512", then the bundled model with the lines above, offline: one load.
def test_bundled_model_runs_the_field_lines(monkeypatch, caplog) -> None:
    monkeypatch.setenv("VLLM_CPU_MAX_MODEL_LEN", "512")
    monkeypatch.setenv("VLLM_CPU_KV_CACHE", "1")
    with caplog.at_level("DEBUG", logger="hearth"):
        llm = LLM(model=default_model_path(), device="cpu", debug=True, kv_cache_dtype="float16", num_gpu_blocks=0,
                  cpu_kv_cache=True, kv_cache_space=0.05)
    assert llm.engine.model_config.max_model_len == 512
    assert llm.engine.cache_config.kv_cache_dtype == str(llm.engine.model_config.dtype).removeprefix("torch.")
    text = "\n".join(_messages(caplog))
    assert "Loaded model architecture: LlamaForCausalLM (hearth family llama)" in text
    assert "Loading weight file" in text
    assert "--kv-cache-dtype float16:" in text and "accepted VLLM_CPU_KV_CACHE=1" in text
    out = llm.generate("The capital of France is", SamplingParams(temperature=0.7, top_p=0.8, max_tokens=8,
                                                                  batch_size=1, seed=0))
    assert out[0].outputs[0].token_ids


# The lines that already ran before issue 51, once more beside the rest: the seed's launch line with its no-op
# flags and VLLM_CPU_* variables, and LLM.from_engine_args(EngineArgs(device="cpu", swap_space=2, ...)) generating.
# (python -m ...api_server and curl: tests/unit/test_vllm_compat.py, tests/server/.)
def test_lines_supported_before(monkeypatch, caplog) -> None:
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    with caplog.at_level("INFO", logger="hearth"):
        args = engine_args_from(build_parser().parse_args(SERVE_LINE))
    assert args.enforce_eager and any(m.startswith("accepted --enforce-eager") for m in _messages(caplog))
    llm = LLM.from_engine_args(EngineArgs(model=default_model_path(), device="cpu", enforce_eager=True,
                                          swap_space=2, max_model_len=1024, dtype="fp16", block_size=16))
    out = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=4))
    assert out[0].outputs[0].token_ids


def test_docs_table_names_tests_of_this_file() -> None:
    import re
    import sys
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "vllm-drop-in.md").read_text()
    table = page.split("## Lines from the field reports", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(test_\w+)`", table))
    assert named and all(hasattr(sys.modules[__name__], name) for name in named), named
