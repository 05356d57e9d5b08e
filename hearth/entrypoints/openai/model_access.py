"""Which models the request's API key may use and see: the one authorization step between a route and a model.

Every route family reaches a model through a ServedModels (`context(name)` loads and returns it, `listings()`
names them), and the server hands them KeyScopedModels, so a key limited to some models (`models = [...]` in
--api-key-file) can neither load, tokenize with, describe nor list any other, whichever API it speaks. Routes that
answer without a ServedModels (the gateway, /v1/models, /status) call may_use / may_see themselves.
"""
from __future__ import annotations

from hearth.entrypoints.openai.api_keys import current_key
from hearth.entrypoints.openai.errors import APIError
from hearth.entrypoints.openai.served_models import Listing, ServedModels
from hearth.entrypoints.openai.serving_common import ServingContext


def _allowed() -> frozenset[str] | None:
    spec = current_key.get()
    return spec.models if spec is not None else None


def may_see(name: str) -> bool:
    allowed = _allowed()
    return allowed is None or name in allowed


def may_use(name: str | None) -> None:
    """Raise a 403 (code model_not_allowed, param model) unless the request's key may use the named model. Runs
    before the name is looked up, so a refused name is neither loaded nor confirmed to exist."""
    spec = current_key.get()
    if spec is None or spec.models is None:
        return
    allowed = sorted(spec.models)
    if name is None or name == "":
        raise APIError(403, f"key {spec.name!r} may use only the models {allowed}: name one in 'model'",
                       "permission_error", param="model", code="model_not_allowed")
    if name not in spec.models and name.removesuffix(":latest") not in spec.models:  # (Ollama's name for it)
        raise APIError(403, f"key {spec.name!r} may not use the model {name!r}; it may use {allowed}",
                       "permission_error", param="model", code="model_not_allowed")


def visible_status(status: dict) -> dict:
    """A GET /status body with only the models the key may see (and the totals over those)."""
    models = [m for m in status["models"] if may_see(m["name"])]
    return {**status, "models": models, "num_requests_running": sum(m["num_requests_running"] for m in models),
            "num_requests_waiting": sum(m["num_requests_waiting"] for m in models)}


class KeyScopedModels:
    """A ServedModels seen through the request's key: context() authorizes first, listings() shows its models."""

    def __init__(self, models: ServedModels) -> None:
        self.models = models

    async def context(self, name: str | None) -> ServingContext:
        may_use(name)
        return await self.models.context(name)

    def listings(self) -> list[Listing]:
        return [m for m in self.models.listings() if may_see(m.name)]
