"""Admin routes of a multi-model server: GET /models, POST /models/load, POST /models/unload (what `hearth ps`
reads; an admin UI drives them)."""
from __future__ import annotations

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict

from hearth.entrypoints.openai.errors import APIError
from hearth.entrypoints.openai.model_access import visible_status
from hearth.entrypoints.openai.model_router import ModelRouter


class ModelAction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str


def register(app: FastAPI, router: ModelRouter) -> None:
    from hearth.entrypoints.openai.body import parse_body

    @app.get("/status")
    async def status() -> dict:
        return visible_status(router.status())

    @app.get("/models")
    async def list_models() -> dict:
        return {"object": "list", "data": [router.describe(e) for e in router.entries]}

    @app.post("/models/load")
    async def load_model(raw: Request) -> dict:
        body = await parse_body(raw, ModelAction)
        await router.context(body.model)
        return router.describe(router.resolve(body.model))

    @app.post("/models/unload")
    async def unload_model(raw: Request) -> dict:
        body = await parse_body(raw, ModelAction)
        entry = router.resolve(body.model)
        if entry.load_task is not None:
            raise APIError(409, f"the model {entry.spec.name!r} is loading; unload it once it has loaded",
                           param="model", code="model_loading")
        await router.unload(entry, reason="on request (POST /models/unload)")
        return router.describe(entry)
