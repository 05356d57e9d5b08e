"""From logits to next tokens: logits processors, then greedy or random sampling, plus logprobs.

Reproducibility: a request with a seed draws from its own torch.Generator, one draw per sampled token, so its
tokens do not depend on which other requests share the batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from hearth.kernels import fused
from hearth.sampling_params import SamplingType
from hearth.structured.bitmask import apply_grammar_masks

if TYPE_CHECKING:  # (the engine's requests are what it samples for; the layer never imports the engine)
    from hearth.engine.request import Request


@dataclass
class TokenLogprobs:
    """Logprob of the chosen token, its rank (1 = most likely), and the top-k alternatives."""

    token_id: int
    logprob: float
    rank: int
    top: list[tuple[int, float]]


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]
    token_tensor: torch.Tensor | None = None  # token_ids as an int64 tensor [N]


def logprobs_of(logprobs: torch.Tensor, token_ids: torch.Tensor, k: int) -> list[TokenLogprobs]:
    """logprobs: [N, V] (already log-softmaxed); token_ids: [N]."""
    chosen = logprobs.gather(1, token_ids.unsqueeze(1)).squeeze(1)  # [N]
    ranks = (logprobs > chosen.unsqueeze(1)).sum(1) + 1
    top_v, top_i = logprobs.topk(k, dim=-1) if k > 0 else (None, None)
    out = []
    for r in range(token_ids.shape[0]):
        top = list(zip(top_i[r].tolist(), top_v[r].tolist())) if k > 0 else []
        out.append(TokenLogprobs(int(token_ids[r]), float(chosen[r]), int(ranks[r]), top))
    return out


def _has_processors(r: Request) -> bool:
    """Whether apply_processors changes this request's logits now."""
    p = r.params
    return bool(p.logit_bias) or r.num_output_tokens < p.min_tokens or p.needs_penalties


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    """Greedy tokens of [n, V] logits: the C kernel over every thread where it takes them, else torch (same ids)."""
    out = fused.argmax(logits)
    return logits.argmax(dim=-1) if out is None else out


def _plain_greedy(r: Request) -> bool:
    """Greedy with nothing that changes the logits or asks for logprobs: the token is the row's argmax."""
    return (r.params.sampling_type == SamplingType.GREEDY and r.params.logprobs is None and r.grammar is None
            and not _has_processors(r))


def _filters(r: Request) -> bool:
    """top-k / top-p / min-p: the request samples from a filtered distribution."""
    p = r.params
    return p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0.0


class Sampler:
    def __init__(self, vocab_size: int, seed: int = 0) -> None:
        self.vocab_size = vocab_size
        self.generator = torch.Generator().manual_seed(seed)  # for requests without their own seed

    def __call__(self, logits: torch.Tensor, reqs: list[Request]) -> SamplerOutput:
        """logits: [len(reqs), V] float32 (the model's raw output for each request's last token)."""
        logits = logits[:, : self.vocab_size]
        if all(map(_plain_greedy, reqs)):  # one argmax, no copies (every torch op adds per-step overhead)
            token_ids = _argmax(logits)
            return SamplerOutput(token_ids.tolist(), [None] * len(reqs), token_ids)
        want_lp = [r.params.logprobs is not None for r in reqs]
        raw_logprobs = torch.log_softmax(logits, dim=-1) if any(want_lp) else None
        grammars = [getattr(r, "grammar", None) for r in reqs]
        if any(map(_has_processors, reqs)) or any(g is not None for g in grammars):  # (else read-only: no copy)
            logits = self.apply_processors(logits.clone(), reqs)
            if any(g is not None for g in grammars):
                apply_grammar_masks(logits, grammars)  # structured output: grammar's tokens only

        token_ids = torch.empty(len(reqs), dtype=torch.long)
        greedy = [i for i, r in enumerate(reqs) if r.params.sampling_type == SamplingType.GREEDY]
        rand = [i for i, r in enumerate(reqs) if r.params.sampling_type != SamplingType.GREEDY]
        if greedy:
            token_ids[greedy] = _argmax(logits if len(greedy) == len(reqs) else logits[greedy])
        if len(rand) == len(reqs):
            token_ids = self._sample(logits, reqs)
        elif rand:
            token_ids[rand] = self._sample(logits[rand], [reqs[i] for i in rand])

        logprobs: list[TokenLogprobs | None] = [None] * len(reqs)
        if raw_logprobs is not None:
            rows = [i for i, w in enumerate(want_lp) if w]
            k = max(reqs[i].params.logprobs for i in rows)
            for i, entry in zip(rows, logprobs_of(raw_logprobs[rows], token_ids[rows], k)):
                entry.top = entry.top[: reqs[i].params.logprobs]
                logprobs[i] = entry
        return SamplerOutput(token_ids.tolist(), logprobs, token_ids)

    # ---- logits processors ----
    def apply_processors(self, logits: torch.Tensor, reqs: list[Request]) -> torch.Tensor:
        for i, r in enumerate(reqs):
            p = r.params
            if p.logit_bias:
                ids = torch.tensor(list(p.logit_bias.keys()), dtype=torch.long)
                logits[i, ids] += torch.tensor(list(p.logit_bias.values()), dtype=logits.dtype)
            if r.num_output_tokens < p.min_tokens:
                banned = list(p.stop_token_ids or []) + ([] if p.ignore_eos else list(r.eos_token_ids))
                if banned:
                    logits[i, banned] = float("-inf")
            if p.needs_penalties:
                self._apply_penalties(logits[i], r)
        return logits

    def _apply_penalties(self, row: torch.Tensor, r: Request) -> None:
        """vLLM/OpenAI semantics: repetition over prompt + output; presence and frequency over output only."""
        p = r.params
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(r.all_token_ids)), dtype=torch.long)
            seen = seen[seen < row.shape[0]]
            vals = row[seen]
            row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if (p.presence_penalty or p.frequency_penalty) and r.output_token_ids:
            counts = torch.bincount(torch.tensor(r.output_token_ids, dtype=torch.long), minlength=row.shape[0])
            counts = counts[: row.shape[0]].to(row.dtype)
            row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)

    def probs(self, logits: torch.Tensor, reqs: list[Request]) -> torch.Tensor:
        """The distribution random sampling draws from: temperature, then top-k / top-p / min-p, then softmax.
        logits: [len(reqs), V], processors already applied."""
        return torch.softmax(self._scaled(logits, reqs), dim=-1)

    def _scaled(self, logits: torch.Tensor, reqs: list[Request]) -> torch.Tensor:
        """logits / temperature, then top-k / top-p / min-p (dropped tokens -inf): the softmax of this is probs."""
        temps = torch.tensor([r.params.temperature for r in reqs], dtype=logits.dtype).unsqueeze(1)
        logits = logits / temps
        if any(map(_filters, reqs)):
            logits = self._top_k_top_p_min_p(logits, reqs)
        return logits

    def _sample(self, logits: torch.Tensor, reqs: list[Request]) -> torch.Tensor:
        """One uniform draw per row, inverted through the row's cumulative distribution (an exponential race,
        argmax(p / E), draws one exponential per vocabulary entry: an order of magnitude more work on a big vocabulary).
        The C kernel (fused.sample) does it in one call per kind of row: rows without top-k / top-p / min-p on the
        raw logits with 1 / temperature, the others on their scaled, filtered logits. Rows it cannot take, or no
        kernel, go through torch's softmax, cumsum and searchsorted. Either way a row's token depends only on its
        own logits, parameters and draw, never on its batch mates."""
        u = torch.stack([torch.rand((), generator=self.generator_for(r)) for r in reqs])
        if not fused.available():
            return _inverse_cdf(self.probs(logits, reqs), u)
        tokens = torch.empty(len(reqs), dtype=torch.long)
        filtered = [i for i, r in enumerate(reqs) if _filters(r)]
        plain = [i for i, r in enumerate(reqs) if not _filters(r)]
        if plain:
            inv_t = torch.tensor([1.0 / reqs[i].params.temperature for i in plain], dtype=torch.float32)
            rows = logits if len(plain) == len(reqs) else logits[plain]
            tokens[plain] = fused.sample(rows.float(), u[plain], inv_t)
        if filtered:
            sub = [reqs[i] for i in filtered]
            x = self._scaled(logits[filtered], sub).float()
            tokens[filtered] = fused.sample(x, u[filtered], torch.ones(len(filtered)))
        bad = tokens < 0
        if bool(bad.any()):
            idx = bad.nonzero().squeeze(1).tolist()
            tokens[bad] = _inverse_cdf(self.probs(logits[idx], [reqs[i] for i in idx]), u[bad])
        return tokens

    def generator_for(self, r: Request) -> torch.Generator:
        if r.params.seed is None:
            return self.generator
        gen = getattr(r, "generator", None)
        if gen is None:
            gen = torch.Generator().manual_seed(r.params.seed)
            r.generator = gen
        return gen

    @staticmethod
    def _top_k_top_p_min_p(logits: torch.Tensor, reqs: list[Request]) -> torch.Tensor:
        """Rows with top-k / top-p / min-p keep their filtered logits, the rest -inf; other rows are unchanged.
        The kept tokens are a prefix of the row's descending order, so only the top candidates are ordered
        (topk of 1024 entries is far cheaper than a full sort of a big vocabulary); a row whose kept prefix might extend
        past them is redone with a full sort."""
        v = logits.shape[1]
        rows = [i for i, r in enumerate(reqs) if _filters(r)]
        if not rows:
            return logits
        sub, sub_reqs = logits[rows], [reqs[i] for i in rows]
        ks = [r.params.top_k for r in sub_reqs if 0 < r.params.top_k < v]
        c = min(v, max([_CANDIDATES] + ks))
        out = _filter_prefix(sub, sub_reqs, c)
        if out is None:
            out = _filter_prefix(sub, sub_reqs, v)
        logits[rows] = out
        return logits


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row of probs [n, V], the first entry whose cumulative mass exceeds u * total (u [n] in [0, 1))."""
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:]
    idx = torch.searchsorted(cdf, u.unsqueeze(1) * total, right=True)  # never a zero-mass entry
    last = torch.searchsorted(cdf, total)  # u * total can round up to total: stay on the last entry with mass
    return torch.minimum(idx, last).squeeze(1)


# Candidates ordered for top-k / top-p / min-p before falling back to a full sort of the vocabulary.
_CANDIDATES = 1024


def _filter_prefix(logits: torch.Tensor, reqs: list[Request], c: int) -> torch.Tensor | None:
    """Filtered rows from the c largest logits of each row; None when some row's kept prefix may be longer."""
    v = logits.shape[1]
    top_k = torch.tensor([r.params.top_k if 0 < r.params.top_k < v else v for r in reqs])
    top_p = torch.tensor([r.params.top_p for r in reqs], dtype=logits.dtype)
    min_p = torch.tensor([r.params.min_p for r in reqs], dtype=logits.dtype)
    vals, order = logits.topk(c, dim=-1) if c < v else logits.sort(dim=-1, descending=True)
    drop = torch.arange(c).unsqueeze(0) >= top_k.unsqueeze(1)
    # Probabilities within the top-k set: its normalizer is over the candidates when k <= c, else the whole row.
    lse = torch.where(top_k <= c, torch.logsumexp(vals.masked_fill(drop, float("-inf")), dim=-1),
                      torch.logsumexp(logits, dim=-1))
    probs = torch.exp(vals - lse.unsqueeze(1)).masked_fill(drop, 0.0)
    # top-p: keep the smallest prefix whose mass reaches p (the first token always stays).
    # NOTE: only rows with top_p < 1: the float cumsum can reach 1.0 early and would cut a row's tail.
    cum_before = probs.cumsum(dim=-1) - probs
    drop |= (cum_before >= top_p.unsqueeze(1)) & (top_p < 1.0).unsqueeze(1)
    # min-p: drop tokens below min_p times the top probability.
    drop |= probs < (min_p.unsqueeze(1) * probs[:, :1])
    drop[:, 0] = False
    if c < v and not bool((drop[:, -1] | (top_k <= c)).all()):
        return None
    return torch.full_like(logits, float("-inf")).scatter_(1, order, vals.masked_fill(drop, float("-inf")))
