"""A request as the engine sees it: token ids in, token ids out, plus bookkeeping for the scheduler."""
from __future__ import annotations

import time
from enum import IntEnum

from hearth.multimodal.inputs import ImageInput
from hearth.pooling_params import PoolingParams
from hearth.sampling_params import SamplingParams


class RequestStatus(IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    # NOTE: everything past PREEMPTED is finished.
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.PREEMPTED

    @property
    def finish_reason(self) -> str | None:
        return {RequestStatus.FINISHED_STOPPED: "stop", RequestStatus.FINISHED_LENGTH: "length",
                RequestStatus.FINISHED_ABORTED: "abort"}.get(self)


class Request:
    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams | PoolingParams,
                 eos_token_ids: list[int], arrival_time: float | None = None, lora_id: int = 0,
                 lora_scale: float = 1.0, mm_inputs: list[ImageInput] | None = None) -> None:
        self.request_id = request_id
        self.group_id = request_id  # the user request this sequence is one of (its n siblings share it)
        # A pooling request (an embedding, a score) runs its whole prompt in one pass and finishes in that step.
        self.is_pooling = isinstance(params, PoolingParams)
        self.priority = getattr(params, "priority", 0)  # (pooling requests have none)
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(prompt_token_ids)
        # len(output_token_ids) and len(all_token_ids), kept as plain attributes: read several times per token per
        # step (a property call each, ~260 per step with 32 running). append_output_token is the only writer.
        self.num_output_tokens = 0
        self.num_tokens = len(self.all_token_ids)
        self.params = params
        self.lora_id = lora_id  # the LoRA adapter it runs under (its LoRARequest's lora_int_id); 0: the base model
        self.lora_scale = lora_scale  # what that adapter's delta is multiplied by (its LoRARequest's scale)
        # Images whose embeddings fill prompt positions (hearth.multimodal), in prompt order; [] for text only.
        self.mm_inputs: list[ImageInput] = list(mm_inputs or [])
        self.eos_token_ids = eos_token_ids
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        # Tokens whose KV is in the cache. The scheduler advances it; preemption resets it to 0.
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache (first schedule)
        self.num_preemptions = 0
        self.arrival_time = arrival_time if arrival_time is not None else time.monotonic()
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        # Per-step results not yet handed to the caller.
        self.pending_logprobs: list = []
        self.prompt_logprobs: list | None = None
        self.prompt_logprobs_cursor = 0  # prompt positions whose logprobs are computed
        self.block_hashes: list[int] = []  # chained hashes of this request's full blocks, grown lazily
        # Structured output: this sequence's grammar state (hearth.structured.compiler.GrammarMatcher), or None.
        self.grammar = None
        # Speculative decoding: draft tokens proposed for the next step (never part of all_token_ids), and how many
        # of this request's tokens have KV in the draft model's cache (draft_model method only).
        self.spec_token_ids: list[int] = []
        self.num_draft_computed = 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        self.num_output_tokens += 1
        self.num_tokens += 1

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, status={self.status.name}, prompt={self.num_prompt_tokens}, "
                f"out={self.num_output_tokens}, computed={self.num_computed_tokens})")
