"""A PEFT adapter's updates placed on a model's wrapped projections: each checkpoint module (q_proj, up_proj, ...)
found through the model's own weight-name tables (CausalLMBase.lora_target), its shapes checked against the
layer's, and its A / B merged into the layer's SlotWeights (fused layers take each target into its slice)."""
from __future__ import annotations

import torch
from torch import nn

from hearth.errors import LoRAError
from hearth.layers.lora import LoRALinear, SlotWeights
from hearth.lora.peft import LoRAModule, PEFTAdapter

# What an adapter may train, for the error that names a target hearth cannot apply it to.
TRAINABLE = "the attention q/k/v/o and MLP gate/up/down projections"


def bind_adapter(adapter: PEFTAdapter, model: nn.Module, layers: dict[str, LoRALinear],
                 dtype: torch.dtype) -> dict[str, SlotWeights]:
    """Each wrapped layer's weights under this adapter (layers it does not train are absent). Raises LoRAError for a
    target the model lacks or one whose shapes are another model's."""
    path = adapter.path
    per_layer: dict[str, list[tuple[str | None, str, LoRAModule]]] = {}
    modules = dict(model.named_modules())
    for module, update in adapter.modules.items():
        target = model.lora_target(module)
        if target is None or target[0] not in layers:
            where = "a module hearth does not apply adapters to" if target is not None and target[0] in modules \
                else f"a module this model ({type(model).__name__}) does not have"
            raise LoRAError(f"LoRA adapter {path!r} targets {module}, {where}; adapters may train {TRAINABLE}")
        per_layer.setdefault(target[0], []).append((target[1], module, update))
    return {name: _slot_weights(path, layers[name], parts, dtype) for name, parts in per_layer.items()}


def _slot_weights(path: str, layer: LoRALinear, parts: list[tuple[str | None, str, LoRAModule]],
                  dtype: torch.dtype) -> SlotWeights:
    rank = sum(update.rank for _, _, update in parts)
    b = torch.zeros(layer.out_features, rank)
    col = 0
    for shard, module, update in parts:
        start, rows = layer.shards[shard] if shard is not None else (0, layer.out_features)
        if update.a.shape[1] != layer.in_features or update.b.shape[0] != rows:
            raise LoRAError(f"LoRA adapter {path!r} does not fit this model (an adapter for another base model?): "
                            f"{module} has lora_A {tuple(update.a.shape)} and lora_B {tuple(update.b.shape)}, the "
                            f"model's {module} is [{rows}, {layer.in_features}]")
        b[start:start + rows, col:col + update.rank] = update.b.float() * update.scale
        col += update.rank
    a = torch.cat([update.a.float() for _, _, update in parts])
    return SlotWeights(a.to(dtype).contiguous(), b.to(dtype).contiguous())
