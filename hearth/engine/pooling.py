"""Pooling requests (embeddings, cross-encoder scores) in the engine, beside generation: the step's pooling pass.

The scheduler admits pooling requests from the one waiting queue (within the step's token budget and sequence
slots, never chunked); this runs their whole prompts in one forward pass and finishes them in that step. Encoders
need no KV cache; a decoder run as an embedder holds the KV blocks the scheduler gave it for that one pass and
gives them back at once, so no KV is kept for pooling requests (full blocks stay in the prefix cache as free blocks).
"""
from __future__ import annotations

import logging

import torch
from torch import nn

from hearth.config import ModelConfig
from hearth.engine.block_manager import BlockManager
from hearth.engine.input_batch import SeqInput, prepare_inputs
from hearth.errors import ParamError
from hearth.engine.outputs import StepOutput
from hearth.engine.request import Request
from hearth.weights import activations
from hearth.layers.pooler import PoolerConfig, finish_embedding, pool
from hearth.pooling_params import PoolingParams

logger = logging.getLogger("hearth")


def resolve_runner(requested: str, model: nn.Module) -> str:
    """vLLM's --runner: auto picks pooling for encoders (they cannot generate), generate for decoders."""
    if requested not in ("auto", "generate", "pooling"):
        raise ValueError(f"--runner must be auto, generate or pooling; got {requested!r}")
    encoder = getattr(model, "is_encoder", False)
    if requested == "generate" and encoder:
        raise ValueError(f"{type(model).__name__} is an encoder and cannot generate text: serve it with "
                         "--runner pooling (or --runner auto)")
    if requested == "auto":
        return "pooling" if encoder else "generate"
    return requested


def is_matryoshka(mc: ModelConfig) -> bool:
    cfg = mc.hf_config
    return bool(cfg.get("is_matryoshka") or cfg.get("matryoshka_dimensions"))


class PoolingRunner:
    def __init__(self, model: nn.Module, mc: ModelConfig, pooler: PoolerConfig, block_manager: BlockManager) -> None:
        self.model = model
        self.mc = mc
        self.pooler = pooler
        self.block_manager = block_manager
        self.is_encoder = bool(getattr(model, "is_encoder", False))
        self.can_score = hasattr(model, "classify")
        self.hidden_size = int(mc.hf_config["hidden_size"])

    def pooler_summary(self) -> str:
        if self.can_score:
            return f"cross-encoder, {self.model.num_labels} label(s)"
        return f"{self.pooler.pooling_type} pooling{', normalized' if self.pooler.normalize else ''}"

    # ---- requests ----
    def check(self, params: PoolingParams) -> None:
        """Raises ValueError (a user error, 400) for what this model cannot do."""
        if params.task == "score" and not self.can_score:
            raise ValueError(f"{self.mc.architecture} has no classification head: scoring needs a cross-encoder "
                             "(e.g. BertForSequenceClassification)")
        if params.task == "embed" and self.can_score:
            raise ValueError(f"{self.mc.architecture} is a cross-encoder: use /v1/score or /v1/rerank, not embeddings")
        if params.task == "score" and self.model.num_labels != 1:
            raise ValueError(f"this cross-encoder has {self.model.num_labels} labels; scoring needs a one-label model")
        if params.dimensions is not None:
            dims = self.mc.hf_config.get("matryoshka_dimensions")
            if not is_matryoshka(self.mc):
                raise ParamError("dimensions", f"model {self.mc.served_model_name!r} does not support matryoshka "
                                 "representation: 'dimensions' cannot be set")
            if params.dimensions > self.hidden_size or (dims and params.dimensions not in dims):
                allowed = dims or f"1..{self.hidden_size}"
                raise ParamError("dimensions",
                                 f"dimensions {params.dimensions} is not one this model supports ({allowed})")

    def check_tokens(self, prompt_token_ids: list[int], params: PoolingParams) -> None:
        tt = params.token_type_ids
        if tt is not None and len(tt) != len(prompt_token_ids):
            raise ParamError(None, "token_type_ids must have one entry per prompt token")

    # ---- the step ----
    @torch.inference_mode()
    def run(self, batch: list[Request]) -> list[StepOutput]:
        """The step's pooling pass over these requests' whole prompts (their KV blocks, for a decoder, allocated
        by the scheduler and freed here, also when the pass fails)."""
        try:
            hidden = self._encode(batch) if self.is_encoder else self._decode_pass(batch)
        finally:
            for req in batch:
                self.block_manager.free(req.request_id)
        lens = [len(r.prompt_token_ids) for r in batch]
        if self.can_score:
            scores = torch.sigmoid(self.model.classify(hidden, lens)[:, 0])  # one label: sentence-transformers' act
            results = [scores[i:i + 1] for i in range(len(batch))]
        else:
            pooled = pool(hidden, lens, self.pooler.pooling_type)  # [B, H] float32
            results = []
            for i, req in enumerate(batch):
                p = req.params
                normalize = self.pooler.normalize if p.normalize is None else p.normalize
                results.append(finish_embedding(pooled[i], normalize, p.dimensions))
        return [StepOutput(r.request_id, 0, [], [], finished=True, finish_reason="stop",
                           num_prompt_tokens=n, pooled=v) for r, n, v in zip(batch, lens, results)]

    def _encode(self, batch: list[Request]) -> torch.Tensor:
        lens = [len(r.prompt_token_ids) for r in batch]
        ids = torch.tensor([t for r in batch for t in r.prompt_token_ids], dtype=torch.long)
        positions = torch.cat([torch.arange(n) for n in lens])
        types = torch.tensor([t for r in batch for t in (r.params.token_type_ids or [0] * len(r.prompt_token_ids))],
                             dtype=torch.long)
        with activations.prompt_rows(0, int(ids.shape[0])):
            return self.model(ids, positions, types, lens)  # [T, hidden]

    def _decode_pass(self, batch: list[Request]) -> torch.Tensor:
        """A decoder's causal pass over whole prompts, in the KV blocks held for this pass."""
        bm = self.block_manager
        seqs = [SeqInput(r.prompt_token_ids, 0, bm.block_table(r.request_id)) for r in batch]
        input_ids, positions, meta = prepare_inputs(seqs, bm.block_size)
        with activations.prompt_rows(0, int(input_ids.shape[0])):
            return self.model(input_ids, positions, meta)  # [T, hidden]
