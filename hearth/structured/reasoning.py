"""Thinking before the grammar: a request of a reasoning model thinks freely between <think> and </think>, and its
structured-output grammar (JSON schema, forced tool call) applies only after </think>. A thinking budget forces
</think> once the model has thought that many tokens.

ReasoningGate stands where a GrammarMatcher does (the sampler's masks, the engine's accept), so neither needs to
know about thinking.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (torch is imported where a gate is built: SamplingParams, and so `hearth --help`, must not)
    import torch


@dataclass(frozen=True)
class ReasoningParams:
    end_token_id: int  # </think>
    start_token_id: int | None = None  # <think>, when the model may open the thinking itself
    in_reasoning: bool = False  # the prompt opened the thinking
    budget: int | None = None  # thinking tokens before </think> is forced (None: no limit)

    def __post_init__(self) -> None:
        if self.budget is not None and self.budget < 0:
            raise ValueError(f"the reasoning budget must be >= 0, got {self.budget}")


class ReasoningGate:
    """One sequence's thinking state around its grammar (inner, or None for free text after the thinking)."""

    def __init__(self, params: ReasoningParams, inner: Any, vocab_size: int) -> None:
        self.params = params
        self.inner = inner
        self.vocab_size = vocab_size
        import torch

        words = inner.bitmask.numel() if inner is not None else (vocab_size + 31) // 32
        self.bitmask = torch.full((words,), -1, dtype=torch.int32)  # [W]
        self.pending: Any = None  # set by the mask prefetcher, as on a GrammarMatcher
        if params.in_reasoning:
            self.state = "think"
        else:
            self.state = "before" if params.start_token_id is not None else "done"
        self.num_thinking = 0

    def fill_bitmask(self) -> None:
        p = self.params
        if self.state == "think":
            if p.budget is not None and self.num_thinking >= p.budget:
                self.bitmask.zero_()
                _allow(self.bitmask, p.end_token_id)  # the budget is spent: end the thinking now
            else:
                self.bitmask.fill_(-1)
            return
        if self.inner is None:
            self.bitmask.fill_(-1)
            return
        self.inner.fill_bitmask()
        self.bitmask.copy_(self.inner.bitmask)
        if self.state == "before" and p.start_token_id is not None:
            _allow(self.bitmask, p.start_token_id)  # the model may still open its thinking

    def wait(self) -> None:
        fut, self.pending = self.pending, None
        if fut is not None:
            fut.result()

    def accept(self, token_id: int) -> bool:
        self.wait()
        if self.state == "before":
            if token_id == self.params.start_token_id:
                self.state = "think"
                return True
            self.state = "done"
        if self.state == "think":
            if token_id == self.params.end_token_id:
                self.state = "done"
            else:
                self.num_thinking += 1
            return True
        return self.inner.accept(token_id) if self.inner is not None else True

    @property
    def is_terminated(self) -> bool:
        return self.state == "done" and self.inner is not None and self.inner.is_terminated

    @property
    def error(self) -> str:
        return self.inner.error if self.inner is not None else "a token the reasoning gate does not allow"


def _allow(bitmask: torch.Tensor, token_id: int) -> None:
    word, bit = divmod(token_id, 32)
    value = int(bitmask[word]) | (1 << bit)
    bitmask[word] = value - (1 << 32) if value >= 1 << 31 else value  # int32 two's complement
