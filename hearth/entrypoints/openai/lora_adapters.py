"""The LoRA adapters a one-model server serves by name: --lora-modules at start, POST /v1/load_lora_adapter and
/v1/unload_lora_adapter at run time (vLLM's routes and bodies). A request names an adapter as its `model` and gets
the model's ServingContext under that adapter; every route family resolves names through ServedModels, so the
OpenAI, Anthropic, Responses and Ollama routes all take adapter names. /v1/models lists each with its parent."""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict

from hearth.entrypoints.openai.errors import APIError
from hearth.entrypoints.openai.lora_modules import LoRAModule
from hearth.entrypoints.openai.serving_common import ServingContext
from hearth.errors import LoRAError
from hearth.lora.request import LoRARequest


class LoadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_int_id: int | None = None  # (vLLM's; the name decides)


class LoRAAdapters:
    """The adapters by name, each with the context its requests get; ids are given here, never reused, so an
    adapter loaded again under its old name shares no cached KV with its earlier self. base: the model's context
    (None until the router's data-parallel model has loaded: attach() gives it)."""

    def __init__(self, base: ServingContext | None) -> None:
        self.base = base
        self.contexts: dict[str, ServingContext] = {}
        self.loading: set[str] = set()  # names whose load is under way
        self.ids = itertools.count(1)
        # llama-server's adapter ids: the position in --lora-modules, then in load order (an unloaded one's id is
        # never given again)
        self.order: list[LoRARequest] = []

    def context(self, name: str | None) -> ServingContext | None:
        return self.contexts.get(name) if name else None

    def new_request(self, module: LoRAModule) -> LoRARequest:
        """The adapter's LoRARequest under a fresh id; a name already served is an APIError 400."""
        taken = module.name in self.contexts or module.name in self.loading
        base_names = (self.base.model_name, *self.base.aliases) if self.base is not None else ()
        if taken or module.name in base_names:
            raise APIError(400, f"the LoRA adapter {module.name!r} has already been loaded" if taken else
                           f"{module.name!r} is the base model's name: give the adapter another",
                           param="lora_name")
        return LoRARequest(module.name, next(self.ids), module.path, module.base_model_name)

    def add(self, lora: LoRARequest) -> None:
        """Serve an adapter the engine has added."""
        self._serve(lora)
        self.order.append(lora)

    def _serve(self, lora: LoRARequest) -> None:
        assert self.base is not None
        self.contexts[lora.lora_name] = dataclasses.replace(self.base, model_name=lora.lora_name, aliases=(),
                                                            lora=lora)

    async def attach(self, base: ServingContext, modules: Sequence[LoRAModule]) -> None:
        """Serve the adapters over a model (re)loaded in worker processes (the router's data-parallel model):
        the first time `modules` (--lora-modules), after a reload the adapters served before, each added to every
        worker through the engine client. Raises LoRAError, or ValueError for a --lora-modules name that is taken."""
        served = [ctx.lora for ctx in self.contexts.values()]
        first, self.base, self.contexts = not self.order, base, {}
        if first:
            for module in modules:
                try:
                    lora = self.new_request(module)
                except APIError as e:  # (a start-up flag's mistake, as build_serving words it)
                    raise ValueError(f"--lora-modules: {e.message}") from None
                await base.engine.add_lora(lora)
                self.add(lora)
            return
        for lora in served:
            await base.engine.add_lora(lora)
            self._serve(lora)

    def name_of(self, index: int) -> str | None:
        """The served adapter with llama-server's id `index` (None: no such id, or unloaded since)."""
        if not 0 <= index < len(self.order):
            return None
        lora = self.order[index]
        ctx = self.contexts.get(lora.lora_name)
        return lora.lora_name if ctx is not None and ctx.lora is lora else None

    async def load(self, module: LoRAModule) -> None:
        lora = self.new_request(module)
        self.loading.add(module.name)
        try:
            await self.base.engine.add_lora(lora)
        except LoRAError as e:
            raise APIError(400, str(e), param="lora_path") from None
        finally:
            self.loading.discard(module.name)
        self.add(lora)

    async def unload(self, name: str) -> None:
        ctx = self.contexts.pop(name, None)
        if ctx is None:
            raise APIError(404, f"the LoRA adapter {name!r} cannot be found", param="lora_name",
                           code="model_not_found")
        await self.base.engine.remove_lora(ctx.lora.lora_int_id)

    def cards(self) -> list[dict]:
        """The /v1/models rows (vLLM's: root is the adapter's folder, parent the model it adapts)."""
        if self.base is None:
            return []
        return [{"id": name, "object": "model", "created": ctx.created, "owned_by": "hearth",
                 "root": ctx.lora.lora_path, "parent": ctx.lora.base_model_name or self.base.model_name,
                 "max_model_len": ctx.max_model_len} for name, ctx in self.contexts.items()]


    def llama_listing(self) -> list[dict]:
        """llama-server's GET /lora-adapters rows. scale is 0: an adapter applies only to the requests that name it
        (as `model` or in `lora`), as llama-server's --lora-init-without-apply leaves them."""
        return [{"id": i, "name": lora.lora_name, "path": lora.lora_path, "scale": 0.0}
                for i, lora in enumerate(self.order) if self.name_of(i) is not None]


def register(app: FastAPI, adapters: LoRAAdapters) -> None:
    """POST /v1/load_lora_adapter and /v1/unload_lora_adapter (the guard keeps them for the admin key)."""
    from hearth.entrypoints.openai.body import openapi_body, parse_body

    @app.post("/v1/load_lora_adapter", openapi_extra=openapi_body(LoadLoRAAdapterRequest))
    async def load_lora_adapter(raw: Request) -> PlainTextResponse:
        body = await parse_body(raw, LoadLoRAAdapterRequest)
        await adapters.load(LoRAModule(body.lora_name, body.lora_path))
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter", openapi_extra=openapi_body(UnloadLoRAAdapterRequest))
    async def unload_lora_adapter(raw: Request) -> PlainTextResponse:
        body = await parse_body(raw, UnloadLoRAAdapterRequest)
        await adapters.unload(body.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
