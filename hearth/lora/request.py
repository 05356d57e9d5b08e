"""LoRARequest: which adapter a request runs under, as vLLM spells it (`from vllm.lora.request import LoRARequest`)."""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """An adapter by name, a positive integer id (the engine's key for it: its pool slot, its prefix-cache blocks)
    and the folder holding adapter_config.json + adapter_model.safetensors. base_model_name: the model it was
    trained on, as /v1/models reports it (None: the served model). scale: what the adapter's delta is multiplied by
    for this request (llama-server's per-request `lora: [{"id", "scale"}]`; 1: as trained; not in vLLM's)."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = None
    scale: float = 1.0

    def __post_init__(self) -> None:
        if not self.lora_name:
            raise ValueError("a LoRARequest needs a name")
        if not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"a LoRARequest's id must be an integer > 0, got {self.lora_int_id!r}")
        if not isinstance(self.scale, (int, float)) or not math.isfinite(self.scale):
            raise ValueError(f"a LoRARequest's scale must be a finite number, got {self.scale!r}")

    # vLLM's short names for the same fields
    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def path(self) -> str:
        return self.lora_path
