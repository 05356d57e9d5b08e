"""HF architecture name -> model class. The one place that knows which families exist."""
from __future__ import annotations

import importlib

from torch import nn

# architecture -> (module under hearth.models, class name)
_MODELS: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("llama", "MistralForCausalLM"),
    "Qwen2ForCausalLM": ("llama", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "GemmaForCausalLM": ("gemma", "GemmaForCausalLM"),
    "Gemma2ForCausalLM": ("gemma2", "Gemma2ForCausalLM"),
    "Gemma3ForCausalLM": ("gemma3", "Gemma3ForCausalLM"),
    "Phi3ForCausalLM": ("phi3", "Phi3ForCausalLM"),
    "MixtralForCausalLM": ("mixtral", "MixtralForCausalLM"),
    "StableLmForCausalLM": ("stablelm", "StableLmForCausalLM"),
    "OlmoForCausalLM": ("olmo", "OlmoForCausalLM"),
    "Olmo2ForCausalLM": ("olmo2", "Olmo2ForCausalLM"),
    "BaichuanForCausalLM": ("baichuan", "BaichuanForCausalLM"),
    "BaiChuanForCausalLM": ("baichuan", "BaichuanForCausalLM"),  # Baichuan-7B (v1) spells it so
    # Images in, text out (hearth.multimodal)
    "LlavaForConditionalGeneration": ("llava", "LlavaForConditionalGeneration"),
    # Encoders, served for pooling only (embeddings, scores)
    "BertModel": ("bert", "BertModel"),
    "BertForSequenceClassification": ("bert", "BertForSequenceClassification"),
}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def family_of(architecture: str) -> str:
    """The hearth.models module implementing an architecture (its "family", as the start-up log names it)."""
    return _MODELS[architecture][0] if architecture in _MODELS else "?"


def get_model_class(architecture: str) -> type[nn.Module]:
    if architecture not in _MODELS:
        raise ValueError(f"unsupported architecture {architecture!r}; hearth supports: "
                         f"{', '.join(supported_architectures())}")
    module, cls = _MODELS[architecture]
    return getattr(importlib.import_module(f"hearth.models.{module}"), cls)
