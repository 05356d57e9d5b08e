"""The router's LoRA adapters over a data-parallel model: attach() serves --lora-modules on the first load, the
same adapters (same ids, same llama-server positions) on the engine of a reload, each added through the engine
client; a module named like the base is a --lora-modules error."""
from __future__ import annotations

import asyncio

import pytest

from hearth.entrypoints.openai.lora_adapters import LoRAAdapters
from hearth.entrypoints.openai.lora_modules import LoRAModule
from hearth.entrypoints.openai.serving_common import ServingContext


class Engine:
    def __init__(self) -> None:
        self.added: list = []

    async def add_lora(self, lora) -> None:
        self.added.append(lora)


def context(engine: Engine) -> ServingContext:
    return ServingContext(engine, None, "tiny", "/models/tiny", 64)  # type: ignore[arg-type]


def test_attach_serves_the_modules_then_the_same_adapters_after_a_reload() -> None:
    adapters = LoRAAdapters(None)
    assert adapters.cards() == [] and adapters.context("a") is None
    first, second = Engine(), Engine()
    asyncio.run(adapters.attach(context(first), [LoRAModule("a", "/ad/a"), LoRAModule("b", "/ad/b.gguf")]))
    assert [(x.lora_name, x.lora_int_id) for x in first.added] == [("a", 1), ("b", 2)]
    assert adapters.context("b").engine is first and adapters.name_of(1) == "b"
    asyncio.run(adapters.attach(context(second), [LoRAModule("ignored", "/ad/x")]))
    assert second.added == first.added and adapters.context("a").engine is second
    assert [adapters.name_of(i) for i in range(3)] == ["a", "b", None]
    assert [c["id"] for c in adapters.cards()] == ["a", "b"] and adapters.cards()[0]["parent"] == "tiny"


def test_a_module_named_like_the_base_is_a_flag_error() -> None:
    with pytest.raises(ValueError, match="--lora-modules: 'tiny' is the base model's name"):
        asyncio.run(LoRAAdapters(None).attach(context(Engine()), [LoRAModule("tiny", "/ad/a")]))
