"""Token-budget continuous batching (vLLM v1's idea): each step spends up to max_num_batched_tokens.

There are no prefill or decode phases. Every request has num_computed_tokens and num_tokens; a step gives each
request some of the difference. Running requests go first (decodes cost one token), then waiting ones, whose
prompts may be split across steps (chunked prefill). When blocks run out, the most recently admitted running
request is preempted: its blocks are freed and it is recomputed later from its prompt plus its outputs so far.
Pooling requests (embeddings, scores) wait in the same queue and spend the same budget and sequence slots, but run
whole (never chunked) in the step's pooling pass, holding KV blocks for that pass only.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from hearth.config import SchedulerConfig
from hearth.engine.block_manager import BlockManager
from hearth.engine.request import Request, RequestStatus


@dataclass(slots=True)
class ScheduledRequest:
    request: Request
    num_new_tokens: int
    # True when this chunk reaches the end of the request's known tokens: its last logits are sampled.
    sample: bool
    # Speculative decoding: draft tokens scheduled after the last known token (counted in num_new_tokens).
    spec_token_ids: list[int] = field(default_factory=list)
    draft_probs: object = None  # torch.Tensor [k, V]: the distribution a draft model sampled them from, if it did


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    # Every scheduled request decodes one token after its prompt (no prefill chunk, no draft): the runner's fast path.
    all_decodes: bool = False
    # Pooling requests for this step's pooling pass (whole prompts; their KV blocks, if any, allocated for it).
    pooling: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled) + sum(r.num_tokens for r in self.pooling)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled and not self.pooling


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, pooling_needs_kv: bool = True) -> None:
        self.config = config
        self.block_manager = block_manager
        self.pooling_needs_kv = pooling_needs_kv  # False for an encoder: its pass keeps no KV
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    # ---- admission ----
    def add_request(self, req: Request) -> None:
        self._enqueue(req, front=False)

    def _enqueue(self, req: Request, front: bool) -> None:
        """fcfs: arrival order (a preempted request goes back to the front). priority: by (priority, arrival)."""
        if self.config.scheduling_policy != "priority":
            if front:
                self.waiting.appendleft(req)
            else:
                self.waiting.append(req)
            return
        key = (req.priority, req.arrival_time)
        i = len(self.waiting)
        while i > 0 and (self.waiting[i - 1].priority, self.waiting[i - 1].arrival_time) > key:
            i -= 1
        self.waiting.insert(i, req)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- scheduling ----
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        bm = self.block_manager
        now = time.monotonic()

        # 1. Running requests, oldest first. Preempt from the back when blocks run out.
        scheduled_running: list[Request] = []
        all_decodes = True
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            if num_new <= 0:
                i += 1
                continue
            spec: list[int] = []
            if req.spec_token_ids and req.num_tokens - req.num_computed_tokens == 1:  # decoding: verify the draft
                spec = req.spec_token_ids[: budget - 1]
                num_new += len(spec)
            while not bm.allocate(req, num_new):
                if spec:  # out of blocks: drop the draft before preempting anyone
                    num_new, spec = 1, []
                    continue
                victim = self.running.pop()  # never one already scheduled this step: we walk from the front
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is req:
                    break
            else:
                scheduled_running.append(req)
                reaches_end = req.num_computed_tokens + num_new - len(spec) == req.num_tokens
                out.scheduled.append(ScheduledRequest(req, num_new, reaches_end, spec))
                if all_decodes and not (num_new == 1 and reaches_end
                                        and req.num_computed_tokens >= max(1, len(req.prompt_token_ids))):
                    all_decodes = False
                budget -= num_new
                i += 1
                continue
            # req itself was preempted: everything after it is gone too.
            break

        # 2. Waiting requests, in arrival order, while there is budget, a sequence slot and blocks (and, if
        # max_prefills_per_decode_step is set, up to that many per step).
        # NOTE: with the cap, a burst is started one (N) per step even on an idle engine: the first prompts
        # decode while the later ones prefill, and the finishes, hence a closed-loop client's next arrivals, stay
        # staggered. (Capping only next to running requests let a burst that met an idle engine, or a wave that
        # all finished in one step, prefill together and finish together again: waves, and a TTFT several times
        # longer.) It trades a little output throughput for a much shorter TTFT under closed-loop load.
        # A request's n sequences hold at most max_num_seqs_per_request slots together: its other sequences
        # wait without blocking the queue, so a later short request is admitted past them.
        cap = self.config.max_prefills_per_decode_step
        per_request = self.config.max_num_seqs_per_request or self.config.max_num_seqs
        held: dict[str, int] = {}
        for r in self.running:
            held[r.group_id] = held.get(r.group_id, 0) + 1
        # LoRA: at most max_loras distinct adapters among the running requests (the layers' slots); a request for
        # another one waits without blocking the queue, as a capped request's sequences do.
        max_loras = self.config.max_loras
        adapters = {r.lora_id for r in self.running if r.lora_id} if max_loras else set()
        started = 0
        pos = 0
        while (pos < len(self.waiting) and budget > 0
               and len(self.running) + len(out.pooling) < self.config.max_num_seqs):
            req = self.waiting[pos]
            if req.is_pooling:
                # A whole prompt, never chunked: the step's first pooling request may go past what the budget has
                # left (so a long one is not starved by running decodes); the others must fit.
                if out.pooling and req.num_tokens > budget:
                    break
                if self.pooling_needs_kv and not bm.allocate(req, req.num_tokens):
                    break  # blocks come back as generations finish
                del self.waiting[pos]
                req.first_scheduled_time = req.first_scheduled_time or now
                out.pooling.append(req)
                budget -= req.num_tokens
                continue
            if cap and started >= cap:
                break
            if out.preempted and req in out.preempted:
                break  # don't re-admit what this step just preempted
            if held.get(req.group_id, 0) >= per_request or (
                    max_loras and req.lora_id and req.lora_id not in adapters and len(adapters) >= max_loras):
                pos += 1
                continue
            computed_blocks, num_cached = ([], 0)
            looked_up = req.num_computed_tokens == 0 and req.params.prompt_logprobs is None and bm.enable_prefix_caching
            if looked_up:
                # NOTE: prompt logprobs need every prompt position computed, so such requests skip the cache.
                computed_blocks, num_cached = bm.get_computed_blocks(req)
            num_new = min(req.num_tokens - num_cached, budget)
            req.num_computed_tokens = num_cached
            if not bm.allocate(req, num_new, computed_blocks):
                req.num_computed_tokens = 0
                break
            if looked_up:
                bm.record_prefix_lookup(req.num_tokens, num_cached)
            del self.waiting[pos]
            held[req.group_id] = held.get(req.group_id, 0) + 1
            if req.lora_id:
                adapters.add(req.lora_id)
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
                req.num_cached_tokens = num_cached
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.scheduled.append(ScheduledRequest(req, num_new, num_cached + num_new == req.num_tokens))
            budget -= num_new
            started += 1
            all_decodes = False
        out.all_decodes = all_decodes and bool(out.scheduled)
        return out

    def _preempt(self, req: Request) -> None:
        self.block_manager.free(req.request_id)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.spec_token_ids = []
        req.num_draft_computed = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self._enqueue(req, front=True)

    def requeue_pooling(self, reqs: list[Request]) -> None:
        """A pooling pass failed: its requests go back to the front of the queue, their blocks freed."""
        for req in reversed(reqs):
            self.block_manager.free(req.request_id)
            if not req.status.is_finished:
                self._enqueue(req, front=True)

    def commit(self, out: SchedulerOutput, num_accepted: dict[str, int] | None = None) -> None:
        """After the model ran: the scheduled tokens now have KV in the cache.

        NOTE: of a speculative request's draft tokens only the accepted ones count: the KV written at rejected
        positions is garbage that later steps overwrite (and no prefix-cache hash ever covers unknown tokens).
        """
        for s in out.scheduled:
            rejected = len(s.spec_token_ids) - (num_accepted or {}).get(s.request.request_id, 0)
            s.request.num_computed_tokens += s.num_new_tokens - rejected

    def finish(self, req: Request, status: RequestStatus) -> None:
        """Mark a request finished (stopped, length, aborted) and free its blocks at once."""
        if req.status.is_finished:
            return
        req.status = status
        if req in self.running:
            self.running.remove(req)
        else:
            try:
                self.waiting.remove(req)
            except ValueError:
                pass
        self.block_manager.free(req.request_id)
