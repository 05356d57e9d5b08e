"""Gemma: the Llama graph with (1 + weight) RMSNorms, GeGLU, tied embeddings scaled by sqrt(hidden)."""
from __future__ import annotations

import torch

from hearth.config import HFConfig
from hearth.layers.attention import AttentionMetadata
from hearth.layers.linear import Linear
from hearth.layers.mlp import GatedMLP
from hearth.layers.norm import RMSNorm
from hearth.layers.qkv_attention import QKVAttention
from hearth.layers.rotary import get_rope
from hearth.models.blocks import DecoderModel, PreNormDecoderLayer
from hearth.models.common import CausalLMBase


def gemma_norm(cfg: HFConfig, dim: int | None = None) -> RMSNorm:
    return RMSNorm(dim or cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6), offset=1.0)


def gemma_mlp(cfg: HFConfig) -> GatedMLP:
    # Gemma 1 checkpoints say hidden_act "gelu" but were trained with the tanh approximation (ACT_AND_MUL maps it).
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    return GatedMLP(cfg["hidden_size"], cfg["intermediate_size"], act)


class GemmaBase(CausalLMBase):
    """Embedding scaled by sqrt(hidden) (rounded to the compute dtype); lm_head tied unless the config says not."""

    def __init__(self, cfg: HFConfig, layers: list[torch.nn.Module]) -> None:
        super().__init__()
        self.model = DecoderModel(cfg, layers, gemma_norm(cfg), embed_scale=cfg["hidden_size"] ** 0.5)
        self.tie_word_embeddings = bool(cfg.get("tie_word_embeddings", True))
        if not self.tie_word_embeddings:
            self.lm_head = Linear(cfg["hidden_size"], cfg["vocab_size"])
        self.final_logit_softcap = cfg.get("final_logit_softcapping")

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, meta)


class GemmaForCausalLM(GemmaBase):
    def __init__(self, cfg: HFConfig, max_len: int) -> None:
        head_dim = cfg.head_dim_
        rope = get_rope(cfg, head_dim, max_len)
        bias = bool(cfg.get("attention_bias", False))
        layers = [PreNormDecoderLayer(
            QKVAttention(cfg["hidden_size"], cfg["num_attention_heads"], cfg.num_kv_heads_, head_dim, rope,
                         head_dim ** -0.5, qkv_bias=bias, o_bias=bias),
            gemma_mlp(cfg), gemma_norm(cfg), gemma_norm(cfg)) for _ in range(cfg["num_hidden_layers"])]
        super().__init__(cfg, layers)
