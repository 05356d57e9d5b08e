"""Convert a PEFT adapter folder to a llama.cpp GGUF LoRA adapter the way llama.cpp's convert_lora_to_gguf.py does,
with the `gguf` package's writer: general.type "adapter", adapter.type "lora", adapter.lora.alpha; each module's
pair as `<base GGUF tensor name>.lora_a` (PEFT's A, [r, in]) and `.lora_b` (B, [out, r]), named through gguf's own
tensor-name map; for the llama architecture B's q/k rows permuted as LlamaModel.permute permutes the base weights
(on a LoraTorchTensor the permute's reshape / swapaxes reach only B). F32 (its default --outtype) or F16.
"""
from __future__ import annotations

import json
import os

import gguf
import numpy as np
import torch

from tests.gguf_writer import llama_permute

Q = gguf.GGMLQuantizationType
_ARCHS = {"LlamaForCausalLM": gguf.MODEL_ARCH.LLAMA, "Qwen2ForCausalLM": gguf.MODEL_ARCH.QWEN2,
          "Qwen3ForCausalLM": gguf.MODEL_ARCH.QWEN3, "Gemma3ForCausalLM": gguf.MODEL_ARCH.GEMMA3}


def write_gguf_adapter(adapter: str, base: str, path: str, qtype: Q = Q.F32, arch_name: str | None = None) -> str:
    """Write `path` from the PEFT folder `adapter` of the HF checkpoint `base` (arch_name: claim another
    architecture, for the refusal test)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(base)
    arch = _ARCHS[cfg.architectures[0]]
    names = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
    heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    with open(os.path.join(adapter, "adapter_config.json")) as f:
        alpha = float(json.load(f)["lora_alpha"])
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in load_file(os.path.join(adapter, "adapter_model.safetensors")).items():
        base_name = key.replace("base_model.model.", "").replace(".lora_A.weight", ".weight")
        base_name = base_name.replace(".lora_B.weight", ".weight")
        pairs.setdefault(base_name, {})["A" if ".lora_A." in key else "B"] = t.float()

    w = gguf.GGUFWriter(path, arch_name or gguf.MODEL_ARCH_NAMES[arch])
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    for hf_name, ab in sorted(pairs.items()):
        a, b = ab["A"], ab["B"]
        if arch is gguf.MODEL_ARCH.LLAMA and ".q_proj." in hf_name:
            b = llama_permute(b, heads)
        elif arch is gguf.MODEL_ARCH.LLAMA and ".k_proj." in hf_name:
            b = llama_permute(b, kv)
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise KeyError(f"{hf_name}: no GGUF name")
        for suffix, t in ((".lora_a", a), (".lora_b", b)):
            data = t.numpy().astype(np.float16 if qtype == Q.F16 else np.float32)
            w.add_tensor(gguf_name + suffix, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
