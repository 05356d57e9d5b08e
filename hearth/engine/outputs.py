"""What the engine hands back: per-step deltas (StepOutput) and, offline, whole results (vLLM's shapes)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hearth.layers.sampler import TokenLogprobs


@dataclass(slots=True)
class StepOutput:
    """What one sequence (one of a request's n) produced in one engine step. The engine fills the token ids; the
front's output processor (output_processor.py) adds the text and may end the sequence at a stop string."""

    request_id: str  # the user's request id (shared by the n sequences)
    index: int  # which of the n sequences
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprobs]
    finished: bool
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    prompt_logprobs: list[TokenLogprobs | None] | None = None  # set once, on the sequence's first output
    pooled: torch.Tensor | None = None  # a pooling request's result: its embedding [H], or its score [1]
    # The last new token is the EOS or stop token id that ended the sequence (the text leaves it out).
    ended_by_stop_token: bool = False
    new_text: str = ""  # (the output processor's)


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    cumulative_logprob: float | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    num_cached_tokens: int = 0
    finished: bool = False

    def add(self, step: StepOutput) -> None:
        out = self.outputs[step.index]
        out.token_ids.extend(step.new_token_ids)
        out.text += step.new_text
        if step.new_logprobs:
            out.logprobs = (out.logprobs or []) + step.new_logprobs
            out.cumulative_logprob = (out.cumulative_logprob or 0.0) + sum(lp.logprob for lp in step.new_logprobs)
        if step.prompt_logprobs is not None and self.prompt_logprobs is None:
            self.prompt_logprobs = step.prompt_logprobs
        self.num_cached_tokens = max(self.num_cached_tokens, step.num_cached_tokens)
        if step.finished:
            out.finish_reason, out.stop_reason = step.finish_reason, step.stop_reason
            self.finished = all(o.finish_reason is not None for o in self.outputs)
