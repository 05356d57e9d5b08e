"""Which serving context a request's `model` picks. Every route family (OpenAI, Responses, Anthropic, Ollama,
pooling) is registered over a ServedModels, so each one works the same with one in-process model (OneModel) and
with several models or data-parallel engines in worker processes (ModelRouter, which has the same two methods)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from hearth.entrypoints.openai.serving_common import ServingContext

if TYPE_CHECKING:
    from hearth.entrypoints.openai.lora_adapters import LoRAAdapters


@dataclass
class Listing:
    """What a model listing (Ollama's /api/tags and /api/ps) says about one served model."""
    name: str
    path: str
    ctx: ServingContext | None  # None: not loaded now


class ServedModels(Protocol):
    async def context(self, name: str | None) -> ServingContext:
        """The named model's context (loading it first if it must); an unknown name is an APIError 404."""

    def listings(self) -> list[Listing]:
        """Every served model, in the order /v1/models lists them."""


class OneModel:
    """`hearth serve MODEL`: the one in-process model, or one of its LoRA adapters by name; any other name is a
    404."""

    def __init__(self, ctx: ServingContext, adapters: LoRAAdapters | None = None) -> None:
        self.ctx = ctx
        self.adapters = adapters

    async def context(self, name: str | None) -> ServingContext:
        adapter = self.adapters.context(name) if self.adapters is not None else None
        if adapter is not None:
            return adapter
        self.ctx.check_model(name)
        return self.ctx

    def listings(self) -> list[Listing]:
        return [Listing(self.ctx.model_name, self.ctx.model_path, self.ctx)]
