"""The GGUF architecture table: GGUF tensor names and metadata -> HF names and config, one row per architecture."""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hearth.config import HFConfig
from hearth.loader.gguf.reader import GGUFError


# GGUF tensor stem (after "blk.N.") -> HF stem (after "model.layers.N."), shared by the dense decoders.
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GEMMA2_NAMES = {**_LAYER_NAMES, "post_attention_norm": "post_attention_layernorm",
                 "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
_PHI3_NAMES = {**_LAYER_NAMES, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# Tensors llama.cpp adds that HF computes from the config instead.
IGNORED = {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}

# "{arch}.<suffix>" metadata -> HF config key.
_CONFIG_KEYS = {
    "context_length": "max_position_embeddings", "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size", "block_count": "num_hidden_layers",
    "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps", "rope.freq_base": "rope_theta",
    "attention.key_length": "head_dim", "attention.sliding_window": "sliding_window",
    "vocab_size": "vocab_size", "attn_logit_softcapping": "attn_logit_softcapping",
    "final_logit_softcapping": "final_logit_softcapping",
}


@dataclass(frozen=True)
class Arch:
    hf_arch: str
    model_type: str
    layer_names: dict[str, str]
    defaults: dict[str, Any] = field(default_factory=dict)  # HF config values GGUF does not state
    permute_qk: bool = False  # llama.cpp's convert permutes q/k rows for rotary interleaving (llama arch)
    norm_offset: float = 0.0  # llama.cpp stores Gemma norms as (1 + w); HF stores w
    fixup: Callable[[dict[str, Any], dict[str, Any]], None] | None = None  # (cfg, metadata) -> None


def _gemma2_fixup(cfg: dict[str, Any], meta: dict[str, Any]) -> None:
    # llama.cpp: the 27B scales queries by 1/sqrt(hidden/heads), the others by 1/sqrt(head_dim).
    big = cfg["num_hidden_layers"] in (46, 62)
    cfg["query_pre_attn_scalar"] = cfg["hidden_size"] // cfg["num_attention_heads"] if big else cfg["head_dim"]


def _gemma3_fixup(cfg: dict[str, Any], meta: dict[str, Any]) -> None:
    _gemma2_fixup(cfg, meta)
    cfg["layer_types"] = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                          for i in range(cfg["num_hidden_layers"])]


def _phi3_fixup(cfg: dict[str, Any], meta: dict[str, Any]) -> None:
    rot = meta.get("phi3.rope.dimension_count")
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    if rot and rot != head_dim:
        cfg["partial_rotary_factor"] = rot / head_dim
    cfg.pop("head_dim", None)  # Phi3Config derives it


_GELU_TANH = {"hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh"}
ARCHS: dict[str, Arch] = {
    "llama": Arch("LlamaForCausalLM", "llama", _LAYER_NAMES, {"hidden_act": "silu", "mlp_bias": False},
                   permute_qk=True),
    "qwen2": Arch("Qwen2ForCausalLM", "qwen2", _LAYER_NAMES, {"hidden_act": "silu", "use_sliding_window": False}),
    "qwen3": Arch("Qwen3ForCausalLM", "qwen3", _LAYER_NAMES, {"hidden_act": "silu", "use_sliding_window": False}),
    "phi3": Arch("Phi3ForCausalLM", "phi3", _PHI3_NAMES, {"hidden_act": "silu"}, fixup=_phi3_fixup),
    "gemma": Arch("GemmaForCausalLM", "gemma", _LAYER_NAMES, _GELU_TANH, norm_offset=1.0),
    "gemma2": Arch("Gemma2ForCausalLM", "gemma2", _GEMMA2_NAMES, _GELU_TANH, norm_offset=1.0, fixup=_gemma2_fixup),
    "gemma3": Arch("Gemma3ForCausalLM", "gemma3_text", _GEMMA2_NAMES,
                    {**_GELU_TANH, "rope_local_base_freq": 10000.0}, norm_offset=1.0, fixup=_gemma3_fixup),
}


def hf_name(gguf_name: str, arch: Arch) -> str | None:
    stem, _, leaf = gguf_name.rpartition(".")  # leaf: weight | bias
    if stem in _TOP_NAMES:
        return f"{_TOP_NAMES[stem]}.{leaf}"
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", stem)
    if m and m[2] in arch.layer_names:
        return f"model.layers.{m[1]}.{arch.layer_names[m[2]]}.{leaf}"
    return None


def build_config(path: str, meta: dict[str, Any], arch_name: str, arch: Arch, names: set[str]) -> HFConfig:
    cfg: dict[str, Any] = {"architectures": [arch.hf_arch], "model_type": arch.model_type, **arch.defaults}
    prefix = arch_name + "."
    for suffix, key in _CONFIG_KEYS.items():
        if prefix + suffix in meta:
            cfg[key] = meta[prefix + suffix]
    for req in ("hidden_size", "num_hidden_layers", "num_attention_heads"):
        if req not in cfg:
            raise GGUFError(f"{path}: metadata lacks {arch_name}.* for {req}; re-convert with a recent llama.cpp")
    kv = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    cfg["num_key_value_heads"] = max(kv) if isinstance(kv, list) else kv  # some files list one per layer
    if isinstance(cfg.get("intermediate_size"), list):
        cfg["intermediate_size"] = max(cfg["intermediate_size"])
    cfg.setdefault("head_dim", meta.get(prefix + "rope.dimension_count") if arch.permute_qk else None)
    if not cfg["head_dim"]:
        cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    cfg.setdefault("rope_theta", 10000.0)
    cfg.setdefault("vocab_size", len(meta.get("tokenizer.ggml.tokens", [])) or None)
    cfg.setdefault("sliding_window", None)
    cfg["rope_scaling"] = _rope_scaling(meta, prefix)
    cfg["tie_word_embeddings"] = "output.weight" not in names
    # HF attention_bias covers o_proj too (Llama, Qwen3); Qwen2 has q/k/v biases by architecture and none on o_proj.
    cfg["attention_bias"] = "blk.0.attn_output.bias" in names
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        gkey = {"pad_token_id": "padding_token_id"}.get(key, key)
        cfg[key] = meta.get(f"tokenizer.ggml.{gkey}")
    for key in ("fim_pre_token_id", "fim_suf_token_id", "fim_mid_token_id"):  # fill-in-the-middle (suffix)
        if f"tokenizer.ggml.{key}" in meta:
            cfg[key] = meta[f"tokenizer.ggml.{key}"]
    if arch.fixup is not None:
        arch.fixup(cfg, meta)
    return HFConfig(cfg)


def _rope_scaling(meta: dict[str, Any], prefix: str) -> dict[str, Any] | None:
    kind = meta.get(prefix + "rope.scaling.type")
    if kind in (None, "none"):
        return None
    rs: dict[str, Any] = {"rope_type": kind, "type": kind}
    if (factor := meta.get(prefix + "rope.scaling.factor")) is not None:
        rs["factor"] = float(factor)
    if (orig := meta.get(prefix + "rope.scaling.original_context_length")) is not None:
        rs["original_max_position_embeddings"] = int(orig)
    return rs


def llama3_rope_scaling(path: str, cfg: dict[str, Any], freqs: torch.Tensor) -> dict[str, Any]:
    """llama.cpp stores Llama-3.1-style rope scaling only as per-frequency divisors (rope_freqs.weight).
    Recover HF's rope_scaling: every Llama 3.x release uses low/high 1/4 and original context 8192, so
    take factor = max divisor and check that these parameters reproduce the stored divisors."""
    factor, low, high, orig = float(freqs.max()), 1.0, 4.0, 8192
    dim = freqs.numel() * 2
    inv_freq = 1.0 / (cfg["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    wavelen = 2 * math.pi / inv_freq
    smooth = np.clip((orig / wavelen - low) / (high - low), 0.0, 1.0)
    expect = 1.0 / ((1 - smooth) / factor + smooth)  # 1 for high freqs, factor for low ones
    if not np.allclose(freqs.double().numpy(), expect, rtol=1e-3):
        raise GGUFError(f"{path}: rope_freqs.weight does not match Llama-3 rope scaling (factor {factor}); "
                        "this rope variant is not supported")
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
            "original_max_position_embeddings": orig}
