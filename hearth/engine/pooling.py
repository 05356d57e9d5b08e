"""Pooling requests (embeddings, cross-encoder scores) in the engine, beside generation.

Each engine step takes a batch of waiting pooling requests (FIFO, within the step's token budget and
max_num_seqs), runs their whole prompts in one forward pass and finishes them in that step. Encoders need no KV
cache; a decoder run as an embedder borrows KV blocks from the engine's block manager for that one pass and gives
them back at once, so no KV is kept for pooling requests (full blocks stay in the prefix cache as free blocks).
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

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


@dataclass
class PoolingRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: PoolingParams
    arrival_time: float


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


class PoolingExecutor:
    def __init__(self, model: nn.Module, mc: ModelConfig, pooler: PoolerConfig, block_manager: BlockManager,
                 max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.model = model
        self.mc = mc
        self.pooler = pooler
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        # A prompt longer than the budget still runs, alone: pooling never splits a prompt into chunks.
        self.token_budget = max_num_batched_tokens
        self.is_encoder = bool(getattr(model, "is_encoder", False))
        self.can_score = hasattr(model, "classify")
        self.hidden_size = int(mc.hf_config["hidden_size"])
        self.waiting: OrderedDict[str, PoolingRequest] = OrderedDict()

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

    def add(self, request_id: str, prompt_token_ids: list[int], params: PoolingParams,
            arrival_time: float | None) -> None:
        if request_id in self.waiting:
            raise ParamError(None, f"request id {request_id!r} is already in use")
        tt = params.token_type_ids
        if tt is not None and len(tt) != len(prompt_token_ids):
            raise ValueError("token_type_ids must have one entry per prompt token")
        self.waiting[request_id] = PoolingRequest(request_id, list(prompt_token_ids), params,
                                                  arrival_time if arrival_time is not None else time.monotonic())

    def abort(self, request_id: str) -> None:
        self.waiting.pop(request_id, None)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    # ---- the step ----
    @torch.inference_mode()
    def step(self) -> list[StepOutput]:
        batch: list[PoolingRequest] = []
        tokens = 0
        for req in self.waiting.values():
            n = len(req.prompt_token_ids)
            if batch and (len(batch) >= self.max_num_seqs or tokens + n > self.token_budget):
                break
            batch.append(req)
            tokens += n
        if self.is_encoder:
            hidden = self._encode(batch)
        else:
            batch, hidden = self._decode_pass(batch)
            if not batch:
                return []  # no KV blocks free this step: the running generations free some as they finish
        for req in batch:
            del self.waiting[req.request_id]
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

    def _encode(self, batch: list[PoolingRequest]) -> torch.Tensor:
        lens = [len(r.prompt_token_ids) for r in batch]
        ids = torch.tensor([t for r in batch for t in r.prompt_token_ids], dtype=torch.long)
        positions = torch.cat([torch.arange(n) for n in lens])
        types = torch.tensor([t for r in batch for t in (r.params.token_type_ids or [0] * len(r.prompt_token_ids))],
                             dtype=torch.long)
        with activations.prompt_rows(0, int(ids.shape[0])):
            return self.model(ids, positions, types, lens)  # [T, hidden]

    def _decode_pass(self, batch: list[PoolingRequest]) -> tuple[list[PoolingRequest], torch.Tensor | None]:
        """A decoder's causal pass over whole prompts, in KV blocks held for this pass only."""
        bm = self.block_manager
        taken: list[tuple[PoolingRequest, Request]] = []
        try:
            for req in batch:
                holder = Request(f"pooling:{req.request_id}", req.prompt_token_ids, req.params, [])
                if not bm.allocate(holder, holder.num_tokens):
                    break
                taken.append((req, holder))
            if not taken:
                return [], None
            seqs = [SeqInput(r.prompt_token_ids, 0, bm.block_table(h.request_id)) for r, h in taken]
            input_ids, positions, meta = prepare_inputs(seqs, bm.block_size)
            with activations.prompt_rows(0, int(input_ids.shape[0])):
                hidden = self.model(input_ids, positions, meta)  # [T, hidden]
        finally:
            for _, holder in taken:
                bm.free(holder.request_id)
        return [r for r, _ in taken], hidden
