"""Reading a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors) into per-module A / B
matrices and scales, refusing what hearth cannot apply with one line naming it.

A module's delta is x A^T B^T * scale, A: [r, in], B: [out, r], scale lora_alpha / r (rsLoRA: / sqrt(r)); r is read
from the tensors, so PEFT's rank_pattern needs nothing, and alpha_pattern is matched as PEFT matches it.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass

import torch

from hearth.errors import LoRAError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
KEY_PREFIX = "base_model.model."  # PEFT saves every tensor under the wrapped model's name
# PEFT features that change more than a projection's output by x A^T B^T: refused by their config key.
UNSUPPORTED_FEATURES = {
    "modules_to_save": "modules_to_save (whole modules saved beside the adapter, such as an embedding or LM head)",
    "use_dora": "DoRA (use_dora)",
    "fan_in_fan_out": "fan_in_fan_out (GPT-2 style Conv1D weights)",
    "lora_bias": "lora_bias (a bias on lora_B)",
    "trainable_token_indices": "trainable_token_indices (trained embedding rows)",
    "layer_replication": "layer_replication",
    "target_parameters": "target_parameters (LoRA on bare parameters, such as MoE experts)",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)",
}
# Targets that are not projections of the decoder layers (vLLM's extra vocabulary / embedding LoRA).
EMBEDDING_MODULES = ("embed_tokens", "lm_head", "wte", "word_embeddings", "embed_out")


@dataclass
class LoRAModule:
    """One target module's low-rank update."""
    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out, r]
    scale: float

    @property
    def rank(self) -> int:
        return int(self.a.shape[0])


@dataclass
class PEFTAdapter:
    """An adapter in PEFT's form, whatever file it came from (a llama.cpp GGUF adapter is read into it too:
    hearth.loader.gguf.lora_adapter)."""
    path: str
    modules: dict[str, LoRAModule]  # the base model's module name (model.layers.0.self_attn.q_proj) -> its update
    base_model_name: str | None  # adapter_config's base_model_name_or_path

    @property
    def rank(self) -> int:
        return max(m.rank for m in self.modules.values())


def read_peft_adapter(path: str, max_rank: int) -> PEFTAdapter:
    """Raises LoRAError (one line naming the adapter and the cause)."""
    if not os.path.isdir(path):
        raise LoRAError(f"LoRA adapter {path!r}: no such folder")
    config = _read_config(path)
    weights = _read_weights(path)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in weights.items():
        module, which = _split_key(path, key)
        pairs.setdefault(module, {})[which] = tensor
    if not pairs:
        raise LoRAError(f"LoRA adapter {path!r}: {WEIGHTS_FILE} holds no lora_A / lora_B tensors")
    alpha, alpha_pattern = float(config.get("lora_alpha", 8)), config.get("alpha_pattern") or {}
    rslora = bool(config.get("use_rslora"))
    modules = {}
    for module, ab in sorted(pairs.items()):
        if set(ab) != {"lora_A", "lora_B"}:
            raise LoRAError(f"LoRA adapter {path!r}: {module} has {', '.join(sorted(ab))} but not both lora_A and "
                            "lora_B")
        a, b = ab["lora_A"], ab["lora_B"]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise LoRAError(f"LoRA adapter {path!r}: {module}'s lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} "
                            "are not [r, in] and [out, r]")
        r = int(a.shape[0])
        if r > max_rank:
            raise LoRAError(f"LoRA adapter {path!r}: rank {r} ({module}) is over --max-lora-rank {max_rank}")
        module_alpha = float(alpha_pattern.get(_pattern_key(alpha_pattern, module), alpha))
        modules[module] = LoRAModule(a, b, module_alpha / (math.sqrt(r) if rslora else r))
    return PEFTAdapter(path, modules, config.get("base_model_name_or_path"))


def _read_config(path: str) -> dict:
    file = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(file):
        raise LoRAError(f"LoRA adapter {path!r} has no {CONFIG_FILE} (a PEFT adapter folder holds {CONFIG_FILE} and "
                        f"{WEIGHTS_FILE})")
    try:
        with open(file, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise LoRAError(f"LoRA adapter {path!r}: {CONFIG_FILE} is not readable JSON ({e})") from None
    if not isinstance(config, dict):
        raise LoRAError(f"LoRA adapter {path!r}: {CONFIG_FILE} is not a JSON object")
    kind = config.get("peft_type", "LORA")
    if kind != "LORA":
        raise LoRAError(f"LoRA adapter {path!r} is a {kind} adapter; hearth serves LoRA adapters only")
    used = [what for key, what in UNSUPPORTED_FEATURES.items() if config.get(key)]
    if config.get("bias", "none") != "none":
        used.append(f"bias={config['bias']!r} (the adapter retrains the base model's biases)")
    if used:
        raise LoRAError(f"LoRA adapter {path!r} uses {', '.join(used)}, which hearth does not support")
    return config


def _read_weights(path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    file = os.path.join(path, WEIGHTS_FILE)
    if not os.path.isfile(file):
        pickled = os.path.isfile(os.path.join(path, "adapter_model.bin"))
        raise LoRAError(f"LoRA adapter {path!r} has no {WEIGHTS_FILE}" + (
            " (only adapter_model.bin: hearth reads safetensors; re-save it with safe_serialization=True)"
            if pickled else ""))
    try:
        return load_file(file)
    except Exception as e:  # (safetensors raises its own error types for a truncated or garbled file)
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise LoRAError(f"LoRA adapter {path!r}: {WEIGHTS_FILE} is not a readable safetensors file "
                        f"({reason})") from None


def _split_key(path: str, key: str) -> tuple[str, str]:
    """'base_model.model.model.layers.0.mlp.up_proj.lora_A.weight' -> ('model.layers.0.mlp.up_proj', 'lora_A')."""
    name = key.removeprefix(KEY_PREFIX)
    parts = name.split(".")
    if len(parts) >= 3 and parts[-1] == "weight" and parts[-2] in ("lora_A", "lora_B"):
        module = ".".join(parts[:-2])
        if parts[-3] in EMBEDDING_MODULES:
            raise LoRAError(f"LoRA adapter {path!r} targets {parts[-3]} (an embedding or LM head), which hearth does "
                            "not support; train it on the attention and MLP projections only")
        return module, parts[-2]
    if "lora_embedding" in name:
        raise LoRAError(f"LoRA adapter {path!r} targets an embedding ({name}), which hearth does not support")
    raise LoRAError(f"LoRA adapter {path!r}: unexpected tensor {key!r} (only lora_A / lora_B weights are supported)")


def _pattern_key(patterns: dict, module: str) -> str:
    """PEFT's get_pattern_key: the first pattern matching the end of the module name."""
    return next((p for p in patterns if re.match(rf"(.*\.)?({p})$", module)), module)
