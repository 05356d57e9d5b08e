"""model_access: the one check of which models the request's key may use and see (the guard names the key)."""
from __future__ import annotations

import asyncio

import pytest

from hearth.entrypoints.openai.api_keys import KeySpec, current_key
from hearth.entrypoints.openai.errors import APIError
from hearth.entrypoints.openai.model_access import KeyScopedModels, may_see, may_use, visible_status
from hearth.entrypoints.openai.served_models import Listing


class _Served:
    def __init__(self) -> None:
        self.asked: list[str | None] = []

    async def context(self, name: str | None):
        self.asked.append(name)
        return name

    def listings(self) -> list[Listing]:
        return [Listing("smol", "/m/smol", None), Listing("gemma", "/m/gemma", None)]


@pytest.fixture
def smol_only():
    token = current_key.set(KeySpec("s", "k", models=frozenset({"smol"})))
    yield
    current_key.reset(token)


def test_the_allowed_model_and_its_ollama_name_pass(smol_only) -> None:
    may_use("smol")
    may_use("smol:latest")  # Ollama's clients' name for the same model
    for name in ("gemma:latest", "gemma", None, ""):
        with pytest.raises(APIError) as e:
            may_use(name)
        assert e.value.status == 403 and e.value.code == "model_not_allowed" and e.value.param == "model"
    assert may_see("smol") and not may_see("gemma")


def test_scoped_models_refuse_before_the_lookup_and_list_only_the_keys_models(smol_only) -> None:
    served = _Served()
    scoped = KeyScopedModels(served)
    with pytest.raises(APIError):
        asyncio.run(scoped.context("gemma"))
    assert served.asked == []  # never looked up, so never loaded
    assert asyncio.run(scoped.context("smol")) == "smol"
    assert [m.name for m in scoped.listings()] == ["smol"]
    status = {"object": "status", "num_requests_running": 5, "num_requests_waiting": 1, "models": [
        {"name": "smol", "num_requests_running": 2, "num_requests_waiting": 0},
        {"name": "gemma", "num_requests_running": 3, "num_requests_waiting": 1}]}
    shown = visible_status(status)
    assert [m["name"] for m in shown["models"]] == ["smol"] and shown["num_requests_running"] == 2


def test_no_key_or_no_list_sees_everything() -> None:
    may_use(None)
    may_use("anything")
    assert [m.name for m in KeyScopedModels(_Served()).listings()] == ["smol", "gemma"]
    token = current_key.set(KeySpec("all", "k2"))
    try:
        may_use("gemma")
        assert may_see("gemma")
    finally:
        current_key.reset(token)
