"""Verification: the target's logits at every drafted position decide which draft tokens stand.

Greedy: accept while the target's argmax equals the draft; then emit the argmax at the first mismatch (or the
bonus token after the last draft), so the output is exactly what plain greedy decoding gives.
Random: exact rejection sampling (Leviathan et al.). Draft token d at position j is accepted with probability
min(1, p(d) / q(d)); on rejection one token is drawn from max(0, p - q), renormalized, and the rest is dropped.
A point-mass draft (prompt lookup, a greedy draft model) has q(d) = 1: accept with p(d), else draw from p with d
removed. The draws use the request's own generator, so seeded requests stay reproducible.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hearth.engine.request import Request
from hearth.layers.sampler import Sampler, TokenLogprobs, logprobs_of
from hearth.sampling_params import SamplingType


@dataclass
class VerifyResult:
    token_ids: list[int]  # the accepted draft tokens, then one more (correction or bonus)
    logprobs: list[TokenLogprobs | None]
    num_accepted: int


def greedy_accept(target_ids: list[int], draft: list[int]) -> list[int]:
    """target_ids: the target's argmax at each of the len(draft) + 1 positions."""
    n = 0
    while n < len(draft) and draft[n] == target_ids[n]:
        n += 1
    return draft[:n] + [target_ids[n]]


def rejection_accept(probs: torch.Tensor, draft: list[int], draft_probs: torch.Tensor | None,
                     gen: torch.Generator) -> list[int]:
    """probs: [len(draft) + 1, V] target distribution; draft_probs: [len(draft), V] or None for a point mass."""
    out: list[int] = []
    for j, d in enumerate(draft):
        p_d = float(probs[j, d])
        q_d = 1.0 if draft_probs is None else float(draft_probs[j, d])
        u = float(torch.rand((), generator=gen))
        if q_d > 0.0 and u * q_d < p_d:  # u < min(1, p/q)
            out.append(d)
            continue
        if draft_probs is None:
            residual = probs[j].clone()
            residual[d] = 0.0
        else:
            residual = (probs[j] - draft_probs[j]).clamp_(min=0.0)
        if float(residual.sum()) <= 0.0:  # only by float rounding: p is then (almost) the draft itself
            residual = probs[j]
        out.append(int(torch.multinomial(residual, 1, generator=gen)))
        return out
    out.append(int(torch.multinomial(probs[len(draft)], 1, generator=gen)))
    return out


class RejectionSampler:
    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    def __call__(self, logits: torch.Tensor, reqs: list[Request], drafts: list[list[int]],
                 draft_probs: list[torch.Tensor | None] | None = None) -> list[VerifyResult]:
        """logits: [sum(len(d) + 1 for d in drafts), V] float32, request by request: row j of a request's group
        is the target's prediction after its j-th input (the last known token, then the draft tokens).

        NOTE: only requests without history-dependent processors get here (no penalties, grammar or pending
        min_tokens): the same per-request processors are then right at every position.
        """
        logits = logits[:, : self.sampler.vocab_size]
        row_reqs = [r for r, d in zip(reqs, drafts) for _ in range(len(d) + 1)]
        raw_logprobs = (torch.log_softmax(logits, dim=-1)
                        if any(r.params.logprobs is not None for r in reqs) else None)
        logits = self.sampler.apply_processors(logits.clone(), row_reqs)
        argmax = logits.argmax(dim=-1).tolist()
        results: list[VerifyResult] = []
        start = 0
        for i, (r, d) in enumerate(zip(reqs, drafts)):
            n = len(d) + 1
            if r.params.sampling_type == SamplingType.GREEDY:
                tokens = greedy_accept(argmax[start:start + n], d)
            else:
                probs = self.sampler.probs(logits[start:start + n], [r] * n)
                q = draft_probs[i] if draft_probs is not None else None
                tokens = rejection_accept(probs, d, q, self.sampler.generator_for(r))
            lps: list[TokenLogprobs | None] = [None] * len(tokens)
            if r.params.logprobs is not None:
                lps = list(logprobs_of(raw_logprobs[start:start + len(tokens)], torch.tensor(tokens),
                                       r.params.logprobs))
            results.append(VerifyResult(tokens, lps, len(tokens) - 1))
            start += n
        return results
