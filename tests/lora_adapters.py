"""Random PEFT LoRA adapters for tiny checkpoints, and transformers + PEFT references with the adapter merged."""
from __future__ import annotations

import json
import os

import torch

ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def build_adapter(base: str, folder: str, seed: int, r: int = 4, alpha: float = 8,
                  targets: tuple[str, ...] = ALL_PROJECTIONS, std: float = 0.1, **config) -> str:
    """Save a PEFT adapter of `base` with random A and B (PEFT starts B at zero, which would test nothing)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), **config))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    peft_model.save_pretrained(folder)
    return folder


def merged_model(base: str, adapter: str | None):
    """transformers' model of `base` with the adapter merged into its weights (None: the base alone)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    return model.eval()


def write_adapter(folder, tensors: dict[str, tuple[torch.Tensor, torch.Tensor]], **config) -> str:
    """A PEFT folder written by hand: {module: (A, B)} under PEFT's key names, r 4 and lora_alpha 8 unless config
    says otherwise."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    flat = {}
    for module, (a, b) in tensors.items():
        flat[f"base_model.model.{module}.lora_A.weight"] = a
        flat[f"base_model.model.{module}.lora_B.weight"] = b
    save_file(flat, os.path.join(folder, "adapter_model.safetensors"))
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": 4, "lora_alpha": 8, **config}, f)
    return str(folder)


def ab(r: int, inp: int, out: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random A [r, inp] and B [out, r]."""
    return torch.randn(r, inp), torch.randn(out, r)
