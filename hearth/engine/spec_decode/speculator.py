"""The engine's side of speculative decoding: who may speculate and how far, proposals, acceptance counters.

Per step: plan() before scheduling puts a draft on each eligible running request (prompt lookup: the tokens
themselves; draft model: placeholders, since the draft needs the blocks the scheduler allocates); fill() after
scheduling runs the draft model over what was scheduled; record() counts what verification accepted.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hearth.engine.block_manager import BlockManager
from hearth.engine.request import Request, RequestStatus
from hearth.engine.scheduler import SchedulerOutput
from hearth.engine.spec_decode.config import SpeculativeConfig
from hearth.engine.spec_decode.draft_proposer import DraftProposer
from hearth.engine.spec_decode.ngram_proposer import ngram_propose

_PLACEHOLDER = -1  # a draft-model token not proposed yet (replaced in fill(), never reaches the model)


@dataclass
class SpecStats:
    """Cumulative counters (vLLM's spec_decode metrics)."""

    num_drafts: int = 0  # verification passes with at least one draft token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)  # [k]: drafts whose token at position i was accepted


def max_draft_len(req: Request, k: int, max_model_len: int) -> int:
    """How many draft tokens req may verify next step: 0 unless it decodes with history-free sampling.

    NOTE: no speculation under a grammar, penalties (they depend on the tokens before each position) or a
    pending min_tokens (stop tokens banned at some positions only). Drafts never reach past max_tokens or
    max_model_len: every emitted token (accepted drafts plus one) must be a token the request may still produce.
    """
    p = req.params
    if (req.status != RequestStatus.RUNNING or req.num_tokens - req.num_computed_tokens != 1
            or req.grammar is not None or p.needs_penalties or req.num_output_tokens < p.min_tokens):
        return 0
    k = min(k, max_model_len - req.num_tokens - 1)
    if p.max_tokens is not None:
        k = min(k, p.max_tokens - req.num_output_tokens - 1)
    return max(k, 0)


class Speculator:
    def __init__(self, config: SpeculativeConfig, max_model_len: int, draft: DraftProposer | None = None) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.draft = draft
        self.stats = SpecStats(accepted_per_pos=[0] * config.num_speculative_tokens)

    def plan(self, running: list[Request]) -> None:
        c = self.config
        for req in running:
            n = max_draft_len(req, c.num_speculative_tokens, self.max_model_len)
            if n == 0:
                req.spec_token_ids = []
            elif self.draft is not None:
                req.spec_token_ids = [_PLACEHOLDER] * n
            else:
                req.spec_token_ids = ngram_propose(req.all_token_ids, n, c.prompt_lookup_min, c.prompt_lookup_max)

    def fill(self, sched: SchedulerOutput, block_manager: BlockManager) -> None:
        """Draft model: propose the tokens the scheduler made room for (in place, same lengths)."""
        if self.draft is None:
            return
        items = [s for s in sched.scheduled if s.spec_token_ids]
        if not items:
            return
        drafts, probs = self.draft.propose([s.request for s in items],
                                           [block_manager.block_table(s.request.request_id) for s in items],
                                           [len(s.spec_token_ids) for s in items])
        for s, d, q in zip(items, drafts, probs):
            s.spec_token_ids[:] = d
            s.draft_probs = q

    def record(self, sched: SchedulerOutput, num_accepted: dict[str, int]) -> None:
        """After verification (and the scheduler's commit): count, and forget the draft's rejected KV."""
        st = self.stats
        for s in sched.scheduled:
            req = s.request
            req.spec_token_ids = []
            req.num_draft_computed = min(req.num_draft_computed, req.num_computed_tokens)
            if not s.spec_token_ids:
                continue
            accepted = num_accepted.get(req.request_id, 0)
            st.num_drafts += 1
            st.num_draft_tokens += len(s.spec_token_ids)
            st.num_accepted_tokens += accepted
            for pos in range(accepted):
                st.accepted_per_pos[pos] += 1
