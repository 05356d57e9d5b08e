"""llama-server's per-request `lora: [{"id": N, "scale": s}]` on the completion and chat routes: which served name a
request runs under and at what scale. id N is the adapter's position in --lora-modules (then runtime loads), as
llama-server numbers its --lora files; scale multiplies its delta, 0 turns it off. hearth runs one adapter per
request: a list with two nonzero scales is a 400, never half applied."""
from __future__ import annotations

import dataclasses
import math

from hearth.entrypoints.openai.errors import APIError
from hearth.entrypoints.openai.lora_adapters import LoRAAdapters
from hearth.entrypoints.openai.protocol import LoRAScale
from hearth.entrypoints.openai.serving_common import ServingContext


def lora_choice(entries: list[LoRAScale] | None, model: str | None,
                adapters: LoRAAdapters | None) -> tuple[str | None, float]:
    """(the name to serve the request under, the adapter's scale). Without a `lora` list: the request's model at
    scale 1. Raises APIError 400 (param lora) for an unknown id, a scale that is not finite, two adapters, or a
    `model` naming another adapter than the list; 404 for a `model` that is neither the base nor an adapter."""
    if entries is None:
        return model, 1.0
    chosen: list[tuple[str, float]] = []
    for k, entry in enumerate(entries):
        name = adapters.name_of(entry.id) if adapters is not None else None
        if name is None:
            served = f"ids 0..{len(adapters.order) - 1}" if adapters is not None and adapters.order else "none"
            raise APIError(400, f"lora[{k}].id {entry.id} is not a LoRA adapter this server serves (adapters: "
                                f"{served})", param="lora")
        if not math.isfinite(entry.scale):
            raise APIError(400, f"lora[{k}].scale must be a finite number", param="lora")
        if entry.scale != 0.0:
            chosen.append((name, entry.scale))
    if len(chosen) > 1:
        raise APIError(400, f"lora lists {len(chosen)} adapters with a nonzero scale; hearth applies one adapter per "
                            "request", param="lora")
    named = model if adapters is not None and adapters.context(model) is not None else None
    if named is not None and (not chosen or chosen[0][0] != named):
        raise APIError(400, f"model names the adapter {named!r} but lora does not apply it: name the base model, "
                            "or leave lora out", param="lora")
    base = adapters.base if adapters is not None else None
    if chosen and model is not None and named is None and base is not None and \
            model not in (base.model_name, *base.aliases):  # (an unknown model stays a 404 with a lora list too)
        raise APIError(404, f"the model {model!r} does not exist; this server serves {base.model_name!r}",
                       param="model", code="model_not_found")
    return chosen[0] if chosen else (model, 1.0)


def with_lora_scale(ctx: ServingContext, scale: float) -> ServingContext:
    """The adapter context's requests at `scale` (the base model's context, or scale 1: ctx itself)."""
    if scale == 1.0 or ctx.lora is None:
        return ctx
    return dataclasses.replace(ctx, lora=dataclasses.replace(ctx.lora, scale=scale))
