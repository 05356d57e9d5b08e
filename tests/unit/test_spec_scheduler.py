"""Scheduling draft tokens: 1 + k tokens for a decoding request, within the budget and the blocks; only accepted
tokens become computed; prefix-cache hashes never cover draft tokens; who may speculate and how far."""
from hearth import SamplingParams
from hearth.config import SchedulerConfig
from hearth.engine.block_manager import BlockManager
from hearth.engine.request import Request, RequestStatus
from hearth.engine.scheduler import Scheduler
from hearth.engine.spec_decode.speculator import max_draft_len

BS = 4


def decoding(num_blocks: int = 16, budget: int = 64, **params) -> tuple[Scheduler, Request]:
    """A scheduler with one request past its 6-token prompt: 7 tokens known, 6 computed."""
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=budget, max_model_len=64),
                      BlockManager(num_blocks, BS, True))
    r = Request("r", [3, 4, 5, 6, 7, 8], SamplingParams(temperature=0.0, **params), eos_token_ids=[1])
    sched.add_request(r)
    while r.num_computed_tokens < 6:  # the prompt, chunked when the budget is small
        sched.commit(sched.schedule())
    r.append_output_token(10)
    return sched, r


def test_draft_scheduled_with_the_last_token_and_partly_accepted() -> None:
    sched, r = decoding()
    r.spec_token_ids = [11, 12, 13, 14, 15]
    out = sched.schedule()
    (s,) = out.scheduled
    assert (s.num_new_tokens, s.spec_token_ids, s.sample) == (6, [11, 12, 13, 14, 15], True)
    bm = sched.block_manager
    table = bm.block_table("r")
    assert len(table) == 3  # positions 0..11
    # Block 1 holds known tokens 4..6 and draft position 7: never hashed (its tokens are not known).
    assert bm.blocks[table[0]].block_hash is not None
    assert bm.blocks[table[1]].block_hash is None and bm.blocks[table[2]].block_hash is None
    sched.commit(out, {"r": 2})  # the last token and 2 draft tokens have valid KV now
    assert r.num_computed_tokens == 6 + 1 + 2


def test_draft_truncated_to_the_budget_and_dropped_when_out_of_blocks() -> None:
    sched, r = decoding(budget=3)
    r.spec_token_ids = [11, 12, 13, 14]
    (s,) = sched.schedule().scheduled
    assert (s.num_new_tokens, s.spec_token_ids) == (3, [11, 12])

    sched, r = decoding(num_blocks=2)  # 8 slots: room for the last token, not for a 4-token draft
    r.spec_token_ids = [11, 12, 13, 14]
    out = sched.schedule()
    (s,) = out.scheduled
    assert (s.num_new_tokens, s.spec_token_ids, out.preempted) == (1, [], [])


def test_preemption_forgets_the_draft() -> None:
    sched, r = decoding()
    r.spec_token_ids, r.num_draft_computed = [11, 12], 5
    sched._preempt(sched.running.pop())
    assert (r.spec_token_ids, r.num_draft_computed, r.num_computed_tokens) == ([], 0, 0)


def test_max_draft_len_rules() -> None:
    _, r = decoding(max_tokens=5)
    r.status = RequestStatus.RUNNING
    assert max_draft_len(r, 8, 64) == 3  # 1 output so far: 4 more tokens at most, the last one is the bonus
    assert max_draft_len(r, 2, 64) == 2
    assert max_draft_len(r, 8, 9) == 1  # 7 known tokens in a 9-token context
    for params in (dict(repetition_penalty=1.2), dict(presence_penalty=0.5), dict(min_tokens=3, max_tokens=8)):
        _, r = decoding(**params)
        assert max_draft_len(r, 4, 64) == 0
    _, r = decoding(max_tokens=8)
    r.append_output_token(10)  # two tokens known but not computed: not decoding
    assert max_draft_len(r, 4, 64) == 0
