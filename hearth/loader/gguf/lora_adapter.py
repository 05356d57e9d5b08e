"""A llama.cpp GGUF LoRA adapter (what convert_lora_to_gguf.py writes) read into the PEFT form hearth applies.

The file: general.type "adapter", adapter.type "lora", adapter.lora.alpha, general.architecture the base model's;
per trained weight two tensors, `<base tensor>.lora_a` (ggml ne [in, r], torch [r, in]: PEFT's A) and `.lora_b`
(ne [r, out], torch [out, r]: PEFT's B), named as the base model's GGUF tensors. llama.cpp's scale is
alpha / r (r: lora_b's ne[0]), or 1 when alpha is 0. For the llama architecture the converter permuted the q/k
rows for ggml's rope, as it does the base weights: on a LoRA pair that only touches B's rows, so B is un-permuted.
"""
from __future__ import annotations

import torch
from torch import nn

from hearth.errors import LoRAError
from hearth.layers.qkv_attention import QKVAttention
from hearth.loader.gguf.arch import ARCHS, Arch, hf_name
from hearth.loader.gguf.checkpoint import unpermute_rows
from hearth.loader.gguf.reader import GGUFError, read_parts, read_tensor
from hearth.lora.peft import EMBEDDING_MODULES, LoRAModule, PEFTAdapter

# GGUF architecture -> the model classes its adapters fit (convert_hf_to_gguf.py writes Mistral as llama).
_ALSO = {"llama": ("MistralForCausalLM",)}


def read_gguf_adapter(path: str, max_rank: int, model: nn.Module) -> PEFTAdapter:
    """Raises LoRAError (one line naming the file and the cause)."""
    try:
        parts = read_parts(path)
    except GGUFError as e:
        raise LoRAError(f"LoRA adapter {e}") from None
    part = parts[0]
    meta = part.metadata
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        kind = meta.get("general.type") or "model"
        raise LoRAError(f"LoRA adapter {path!r} is a GGUF {kind} file, not a LoRA adapter (general.type 'adapter', "
                        f"adapter.type 'lora'); convert one with llama.cpp's convert_lora_to_gguf.py")
    if meta.get("adapter.alora.invocation_tokens"):
        raise LoRAError(f"LoRA adapter {path!r} uses activated LoRA (adapter.alora.invocation_tokens), which hearth "
                        "does not support")
    arch_name = meta.get("general.architecture")
    arch = ARCHS.get(arch_name)
    fits = (arch.hf_arch, *_ALSO.get(arch_name, ())) if arch is not None else ()
    if type(model).__name__ not in fits:
        raise LoRAError(f"LoRA adapter {path!r} is for a {arch_name!r} model, not this {type(model).__name__} "
                        "(an adapter for another base model?)")
    alpha = float(meta.get("adapter.lora.alpha") or 0.0)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for info in part.tensors:
        stem, dot, which = info.name.rpartition(".")
        if not dot or which not in ("lora_a", "lora_b"):
            what = "a norm (mergekit-extract-lora's)" if info.name.endswith("_norm.weight") else "not a lora_a / lora_b"
            raise LoRAError(f"LoRA adapter {path!r}: tensor {info.name!r} is {what}; hearth applies only the LoRA "
                            "pairs of projections")
        pairs.setdefault(stem, {})[which] = read_tensor(part.path, info).float()
    if not pairs:
        raise LoRAError(f"LoRA adapter {path!r} holds no lora_a / lora_b tensors")
    modules = {}
    for stem, ab in sorted(pairs.items()):
        if set(ab) != {"lora_a", "lora_b"}:
            raise LoRAError(f"LoRA adapter {path!r}: {stem} has {', '.join(sorted(ab))} but not both lora_a and "
                            "lora_b")
        a, b = ab["lora_a"], ab["lora_b"]  # [r, in], [out, r]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise LoRAError(f"LoRA adapter {path!r}: {stem}'s lora_a {tuple(a.shape)} and lora_b {tuple(b.shape)} "
                            "are not [r, in] and [out, r] (torch order)")
        module = _module_name(path, stem, arch)
        r = int(a.shape[0])
        if r > max_rank:
            raise LoRAError(f"LoRA adapter {path!r}: rank {r} ({stem}) is over --max-lora-rank {max_rank}")
        if arch.permute_qk:
            b = _unpermute_b(b, module, model)
        modules[module] = LoRAModule(a.contiguous(), b.contiguous(), alpha / r if alpha else 1.0)
    return PEFTAdapter(path, modules, None)


def _module_name(path: str, stem: str, arch: Arch) -> str:
    """'blk.0.attn_q.weight' -> 'model.layers.0.self_attn.q_proj' (the checkpoint module PEFT would name)."""
    hf = hf_name(stem, arch)
    if hf is None or not hf.endswith(".weight"):
        raise LoRAError(f"LoRA adapter {path!r} targets {stem}, which has no place in a {arch.hf_arch}")
    module = hf.removesuffix(".weight")
    if module.rpartition(".")[2] in EMBEDDING_MODULES:
        raise LoRAError(f"LoRA adapter {path!r} targets {stem} (an embedding or LM head), which hearth does not "
                        "support; train it on the attention and MLP projections only")
    return module


def _unpermute_b(b: torch.Tensor, module: str, model: nn.Module) -> torch.Tensor:
    """B's rows back in HF order for q_proj / k_proj (per head, as the base's q/k weights are un-permuted at load).
    A B whose rows do not fit the heads is left for the binding's shape check to refuse."""
    leaf = module.rpartition(".")[2]
    if leaf not in ("q_proj", "k_proj"):
        return b
    target = model.lora_target(module)
    try:
        attn = model.get_submodule(target[0].rpartition(".")[0]) if target is not None else None
    except AttributeError:  # (a layer the model lacks: the binding names it)
        attn = None
    if not isinstance(attn, QKVAttention):
        return b
    heads = attn.num_heads if leaf == "q_proj" else attn.num_kv_heads
    if b.shape[0] != heads * attn.head_dim:
        return b
    return unpermute_rows(b, heads)
