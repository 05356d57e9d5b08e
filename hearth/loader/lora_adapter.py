"""An adapter path read whatever its format: a PEFT folder (hearth.lora.peft) or a llama.cpp GGUF LoRA file
(hearth.loader.gguf.lora_adapter), both into the PEFT form the engine binds to the model's layers."""
from __future__ import annotations

import os

from torch import nn

from hearth.errors import LoRAError
from hearth.lora.peft import PEFTAdapter, read_peft_adapter


def read_adapter(path: str, max_rank: int, model: nn.Module) -> PEFTAdapter:
    """A folder is read as PEFT's, a file as a GGUF adapter. Raises LoRAError."""
    if not os.path.isfile(path):
        return read_peft_adapter(path, max_rank)
    if not _is_gguf(path):
        raise LoRAError(f"LoRA adapter {path!r} is a file but not a GGUF adapter; pass a PEFT adapter folder "
                        "(adapter_config.json + adapter_model.safetensors) or a llama.cpp .gguf LoRA adapter")
    from hearth.loader.gguf.lora_adapter import read_gguf_adapter

    return read_gguf_adapter(path, max_rank, model)


def _is_gguf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False
