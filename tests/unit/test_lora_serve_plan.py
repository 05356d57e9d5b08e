"""`hearth serve`'s LoRA flags before anything serves: --lora-modules in both of vLLM's forms, its mistakes refused
in one line naming the flag, carried to the router of a data-parallel model, refused by name in the modes that cannot
serve adapters by name yet (several models, Ray), and a broken --lora-modules adapter failing the start-up (build_serving) instead of the first request."""
from __future__ import annotations

import argparse
import json

import pytest

from hearth.entrypoints.openai.cli_serve import add_serve_args
from hearth.entrypoints.openai.lora_modules import LoRAModule, parse_lora_modules
from hearth.entrypoints.openai.serve_plan import InProcessPlan, RouterPlan, plan_serve
from hearth.errors import LoRAError


def plan(*argv: str):
    p = argparse.ArgumentParser()
    add_serve_args(p)
    return plan_serve(p.parse_args(list(argv)))


def test_lora_modules_in_both_forms() -> None:
    spec = json.dumps({"name": "b", "path": "/ad/b", "base_model_name": "org/base"})
    assert parse_lora_modules(["a=/ad/a", spec]) == [LoRAModule("a", "/ad/a"), LoRAModule("b", "/ad/b", "org/base")]
    for bad, why in (("a", "not name=path"), ("=/x", "not name=path"), ('{"name": "a"}', "not JSON with a name"),
                     ('{"name": ', "not JSON"), ("a=/x a=/y", "given twice")):
        with pytest.raises(ValueError, match=why) as e:
            parse_lora_modules(bad.split(" "))
        assert str(e.value).startswith("--lora-modules")


def test_the_plan_carries_them_or_refuses_by_name(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("HEARTH_API_KEY", raising=False)
    got = plan("some/model", "--enable-lora", "--max-loras", "4", "--lora-modules", "a=/ad/a")
    assert isinstance(got, InProcessPlan) and got.lora_modules == [LoRAModule("a", "/ad/a")]
    assert got.engine.enable_lora and got.engine.max_loras == 4
    with pytest.raises(ValueError, match="--lora-modules needs --enable-lora"):
        plan("some/model", "--lora-modules", "a=/ad/a")
    dp = plan("some/model", "--enable-lora", "--lora-modules", "a=/ad/a", "--data-parallel-size", "2")
    assert isinstance(dp, RouterPlan) and dp.lora_modules == [LoRAModule("a", "/ad/a")] and dp.base.enable_lora
    assert dp.build().adapters is not None
    with pytest.raises(ValueError, match="--lora-modules needs --enable-lora"):
        plan("some/model", "--lora-modules", "a=/ad/a", "--data-parallel-size", "2")
    (tmp_path / "one.gguf").write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="--enable-lora is for one model for now"):
        plan("--enable-lora", "--models-dir", str(tmp_path))
    with pytest.raises(ValueError, match="--enable-lora is for one model in process"):
        plan("some/model", "--enable-lora", "--ray")
    with pytest.raises(ValueError, match="--enable-lora cannot be combined with the gateway"):
        plan("some/model", "--enable-lora", "--answer-cache-size", "4")


def test_a_broken_lora_module_fails_the_start(tmp_path) -> None:
    from hearth import LLM
    from hearth.entrypoints.openai.serving_build import ServeOptions, build_serving
    from tests.lora_adapters import build_adapter
    from tests.tiny_models import build_checkpoint, tiny_config

    base = build_checkpoint(str(tmp_path / "base"), tiny_config("llama"))
    llm = LLM(base, dtype="float32", kv_cache_space=0.02, enable_lora=True, max_loras=2).engine
    with pytest.raises(LoRAError, match="no such folder"):
        build_serving(llm, ServeOptions(), [LoRAModule("a", str(tmp_path / "missing"))])
    with pytest.raises(ValueError, match="--lora-modules: 'base' is the base model's name"):
        build_serving(llm, ServeOptions(), [LoRAModule("base", str(tmp_path / "base"))])
    good = build_adapter(base, str(tmp_path / "a"), seed=1, targets=("q_proj",))
    serving = build_serving(llm, ServeOptions(), [LoRAModule("a", good)])
    assert [c["id"] for c in serving.adapters.cards()] == ["a"] and serving.adapters.context("a").lora.lora_path == good
