"""The offline pooling API behind LLM.embed(...) and LLM.score(...) (vLLM's names and output shapes)."""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hearth.engine.llm_engine import LLMEngine
from hearth.entrypoints.pooling_inputs import encode_ids, encode_pair, encode_text, truncation_limit
from hearth.pooling_params import PoolingParams


@dataclass
class EmbeddingOutput:
    embedding: list[float]


@dataclass
class ScoringOutput:
    score: float


@dataclass
class PoolingRequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput | ScoringOutput
    finished: bool = True


def run(engine: LLMEngine, ids: itertools.count, inputs: list[tuple[list[int], PoolingParams]]) -> list[
        tuple[str, list[int], torch.Tensor]]:
    order = []
    for prompt, params in inputs:
        rid = f"pool-{next(ids)}"
        engine.add_request(rid, prompt, params)
        order.append((rid, prompt))
    results: dict[str, torch.Tensor] = {}
    try:
        while len(results) < len(order) and engine.has_unfinished_requests():
            for out in engine.step():
                if out.pooled is not None:
                    results[out.request_id] = out.pooled
    except BaseException:
        for rid, _ in order:
            engine.abort_request(rid)
        raise
    return [(rid, prompt, results[rid]) for rid, prompt in order]


def embed(engine: LLMEngine, ids: itertools.count, prompts: str | list[int] | Sequence[str | list[int]],
          params: PoolingParams | None, truncate_prompt_tokens: int | None) -> list[PoolingRequestOutput]:
    if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
        prompts = [prompts]
    params = params or PoolingParams()
    limit = truncation_limit(truncate_prompt_tokens, engine.model_config.max_model_len)
    tokenized = [encode_text(engine.tokenizer, p, limit) if isinstance(p, str) else encode_ids(list(p), limit)
                 for p in prompts]
    return [PoolingRequestOutput(rid, prompt, EmbeddingOutput(vec.tolist()))
            for rid, prompt, vec in run(engine, ids, [(t, params) for t in tokenized])]


def score(engine: LLMEngine, ids: itertools.count, first: str | Sequence[str], second: str | Sequence[str],
          truncate_prompt_tokens: int | None) -> list[PoolingRequestOutput]:
    from hearth.entrypoints.openai.serving_score import score_pairs

    limit = truncation_limit(truncate_prompt_tokens, engine.model_config.max_model_len)
    inputs = []
    for a, b in score_pairs(first if isinstance(first, str) else list(first),
                            second if isinstance(second, str) else list(second)):
        prompt, types = encode_pair(engine.tokenizer, a, b, limit)
        inputs.append((prompt, PoolingParams("score", token_type_ids=types)))
    return [PoolingRequestOutput(rid, prompt, ScoringOutput(float(v[0])))
            for rid, prompt, v in run(engine, ids, inputs)]
