"""The LM head of an HF folder quantized at load (--quantization int8 / int4* / bitsandbytes): int8 per row.

Why: every decode step reads the whole head, and beside int4 projections a bf16 head is a large part of the bytes a
step streams (llama.cpp keeps its head in Q6_K / Q8_0; a GGUF's head stays in its blocks here too). int8 per row,
multiplied with the head's two-term int8 activations (hearth.weights.activations), keeps near ties where they were.
A tied head gets an int8 copy: the embedding stays in the model dtype for its row lookups. Pre-quantized
checkpoints keep their head as stored, and small models (model_loader.SMALL_MODEL_PARAMS) keep theirs dense.
Under tensor parallelism the head stays whole on every rank, as a GGUF head does (distributed/shard.py).
"""
from __future__ import annotations

import logging

import torch
from torch import nn

from hearth import envs
from hearth.layers.linear import Linear
from hearth.weights import prepare
from hearth.weights.packed import QWeight

logger = logging.getLogger("hearth")

# The quant_linear schemes that quantize float weights at load (prequant and gguf keep what the file holds).
AT_LOAD = ("int8", "int4", "int4-g32", "int4-g64", "int4-g128", "nf4")


def wanted(scheme: str | None, params: int, min_params: int) -> bool:
    """Whether a model of `params` parameters loaded with `scheme` gets an int8 head (HEARTH_QUANT_LM_HEAD)."""
    return scheme in AT_LOAD and params >= min_params and envs.quant_lm_head()


def _float_head(model: nn.Module) -> torch.Tensor | None:
    """The dense weight the head's product reads (a tied head: the embedding table); None: nothing to quantize."""
    if getattr(model, "lm_head_qweight", None) is not None:
        return None
    if getattr(model, "tie_word_embeddings", False):
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        if embed is None or embed.qweight is not None or embed.panels is not None:
            return None
        w = embed.weight
    else:
        head = getattr(model, "lm_head", None)
        # (a head with a bias, or loaded in parts, keeps its dense path: apply.linear on a QWeight adds no bias)
        if not isinstance(head, Linear) or head.bias is not None or head.parts is not None or head.panels is not None:
            return None
        w = head.weight
    return w if w.dim() == 2 and w.is_floating_point() else None


def quantize_head(model: nn.Module) -> QWeight | None:
    """model.lm_head_qweight = the head in int8 (prepare.float_head), the dense head freed (an untied one); returns
    it, or None where the head stays dense."""
    w = _float_head(model)
    qw = None if w is None else prepare.float_head(w)
    if qw is None:
        return None
    model.lm_head_qweight = qw
    if not getattr(model, "tie_word_embeddings", False):
        # compute_logits reads only the int8 head now; the file's pages of it went back as it was packed
        model.lm_head.weight = nn.Parameter(torch.empty(0, dtype=w.dtype), requires_grad=False)
    logger.info("LM head quantized at load: int8 per row, %.1f MiB%s (HEARTH_QUANT_LM_HEAD=0 keeps it %s)",
                qw.nbytes() / 2**20, " beside the tied embedding" if getattr(model, "tie_word_embeddings", False)
                else "", str(w.dtype).removeprefix("torch."))
    return qw
