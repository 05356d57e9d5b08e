"""Scheduler: token budget, running before waiting, chunked prefill, max_num_seqs, preemption by recompute.

The fake-model tests keep a fake KV cache (slot -> (token, position)) written the way paged attention writes
it, and check before every sample that the request's whole context reads back correctly through its block
table; the "model" then emits a token that depends on the whole context. So a scheduling or block bug shows up
as a wrong context or a different token sequence. The last tests run a real tiny checkpoint end to end.
"""
import pytest

from hearth import LLM, SamplingParams
from hearth.config import SchedulerConfig
from hearth.engine.block_manager import BlockManager
from hearth.engine.request import Request, RequestStatus
from hearth.engine.scheduler import Scheduler
from tests.tiny_models import build_checkpoint, tiny_config

BS = 4


def make_sched(num_blocks: int, budget: int = 64, max_num_seqs: int = 16, caching: bool = True) -> Scheduler:
    return Scheduler(SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=256),
                     BlockManager(num_blocks, BS, caching))


def req(rid: str, tokens: list[int], max_tokens: int = 8) -> Request:
    return Request(rid, tokens, SamplingParams(temperature=0.0, max_tokens=max_tokens), eos_token_ids=[1])


def fake_next_token(context: list[int]) -> int:
    return (sum((i + 1) * t for i, t in enumerate(context)) * 31 + len(context)) % 97 + 2


class FakeEngine:
    """Drives a Scheduler like LLMEngine.step does, with a fake KV cache instead of a model."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.kv: dict[int, tuple[int, int]] = {}  # slot -> (token id, position)
        self.log: list[list[tuple[str, int, bool]]] = []  # per step: (request id, num_new_tokens, sample)
        self.preempted: list[str] = []

    def slot(self, rid: str, pos: int) -> int:
        table = self.sched.block_manager.block_table(rid)
        return table[pos // BS] * BS + pos % BS

    def step(self) -> None:
        out = self.sched.schedule()
        assert out.num_tokens <= self.sched.config.max_num_batched_tokens
        assert len(self.sched.running) <= self.sched.config.max_num_seqs
        self.preempted += [r.request_id for r in out.preempted]
        self.log.append([(s.request.request_id, s.num_new_tokens, s.sample) for s in out.scheduled])
        # Like attention: every layer writes all of the step's new KV first, then reads.
        for s in out.scheduled:
            r = s.request
            for pos in range(r.num_computed_tokens, r.num_computed_tokens + s.num_new_tokens):
                self.kv[self.slot(r.request_id, pos)] = (r.all_token_ids[pos], pos)
        for s in out.scheduled:
            r = s.request
            ctx = r.num_computed_tokens + s.num_new_tokens
            assert [self.kv[self.slot(r.request_id, p)] for p in range(ctx)] == \
                [(t, p) for p, t in enumerate(r.all_token_ids[:ctx])], f"corrupt KV context for {r.request_id}"
        self.sched.commit(out)
        for s in out.scheduled:
            r = s.request
            assert s.sample == (r.num_computed_tokens == r.num_tokens)
            if s.sample:
                r.append_output_token(fake_next_token(r.all_token_ids))
                if r.num_output_tokens >= r.params.max_tokens:
                    self.sched.finish(r, RequestStatus.FINISHED_LENGTH)

    def run(self, max_steps: int = 1000) -> None:
        for _ in range(max_steps):
            if not self.sched.has_unfinished():
                return
            self.step()
        raise AssertionError("the scheduler made no progress")


def expected_output(prompt: list[int], n: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(fake_next_token(tokens))
    return tokens[len(prompt):]


def assert_all_free(bm: BlockManager) -> None:
    assert [b.ref_cnt for b in bm.blocks] == [0] * bm.num_blocks
    assert bm.num_free_blocks == bm.num_blocks and bm.req_blocks == {}


def test_token_budget_and_chunking_across_requests() -> None:
    sched = make_sched(num_blocks=32, budget=16)
    eng = FakeEngine(sched)
    reqs = [req(c, list(range(10 * i + 10, 10 * i + 20))) for i, c in enumerate("abc")]  # 10 tokens each
    for r in reqs:
        sched.add_request(r)
    eng.step()
    assert eng.log[-1] == [("a", 10, True), ("b", 6, False)]
    assert [r.request_id for r in sched.running] == ["a", "b"] and list(sched.waiting) == [reqs[2]]
    eng.step()  # running first (a decodes, b finishes its prompt), then c with what is left of the budget
    assert eng.log[-1] == [("a", 1, True), ("b", 4, True), ("c", 10, True)]
    eng.step()
    assert eng.log[-1] == [("a", 1, True), ("b", 1, True), ("c", 1, True)]
    eng.run()
    for r in reqs:
        assert r.output_token_ids == expected_output(r.prompt_token_ids, 8)
        assert r.status == RequestStatus.FINISHED_LENGTH
    assert_all_free(sched.block_manager)


def test_chunked_prefill_samples_only_when_the_prompt_is_complete() -> None:
    sched = make_sched(num_blocks=32, budget=8)
    eng = FakeEngine(sched)
    r = req("long", list(range(50, 70)), max_tokens=3)  # 20 tokens over 8 + 8 + 4
    sched.add_request(r)
    eng.step()
    assert eng.log[-1] == [("long", 8, False)]
    assert r.num_computed_tokens == 8 and r.output_token_ids == []
    assert sched.block_manager.block_table("long") == [0, 1]  # blocks only for what is computed
    eng.step()
    assert eng.log[-1] == [("long", 8, False)] and r.output_token_ids == []
    eng.step()
    assert eng.log[-1] == [("long", 4, True)]
    assert r.num_computed_tokens == 20 and len(r.output_token_ids) == 1
    eng.run()
    assert eng.log[3:] == [[("long", 1, True)], [("long", 1, True)]]
    assert r.output_token_ids == expected_output(r.prompt_token_ids, 3)
    assert_all_free(sched.block_manager)


def test_running_requests_go_before_waiting_ones() -> None:
    sched = make_sched(num_blocks=32, budget=12)
    eng = FakeEngine(sched)
    sched.add_request(req("a", [5] * 6))
    sched.add_request(req("b", [6] * 6))
    eng.step()
    assert eng.log[-1] == [("a", 6, True), ("b", 6, True)]
    sched.add_request(req("c", [7] * 20))
    eng.step()  # decodes first; the newcomer gets the rest of the budget as a chunk
    assert eng.log[-1] == [("a", 1, True), ("b", 1, True), ("c", 10, False)]
    eng.step()
    assert eng.log[-1] == [("a", 1, True), ("b", 1, True), ("c", 10, True)]


def test_max_prefills_per_decode_step_staggers_bursts() -> None:
    sched = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=100, max_model_len=256,
                                      max_prefills_per_decode_step=1), BlockManager(64, BS, True))
    eng = FakeEngine(sched)
    reqs = [req(c, [i + 3] * 5, max_tokens=4) for i, c in enumerate("abcde")]
    for r in reqs[:2]:
        sched.add_request(r)
    eng.step()  # even an idle engine starts one prompt per step (a burst that prefills together ends together)
    assert eng.log[-1] == [("a", 5, True)]
    for r in reqs[2:]:
        sched.add_request(r)
    eng.step()  # next to decodes: one new prompt per step, in arrival order
    assert eng.log[-1] == [("a", 1, True), ("b", 5, True)]
    eng.step()
    assert eng.log[-1] == [("a", 1, True), ("b", 1, True), ("c", 5, True)]
    eng.run()
    for r in reqs:
        assert r.output_token_ids == expected_output(r.prompt_token_ids, 4)
    assert_all_free(sched.block_manager)
    with pytest.raises(ValueError, match="max-prefills-per-decode-step"):
        SchedulerConfig(max_prefills_per_decode_step=-1)


def test_max_num_seqs() -> None:
    sched = make_sched(num_blocks=64, budget=100, max_num_seqs=2)
    eng = FakeEngine(sched)
    reqs = [req(c, [i + 3] * 5, max_tokens=2) for i, c in enumerate("abcd")]
    for r in reqs:
        sched.add_request(r)
    eng.step()
    assert eng.log[-1] == [("a", 5, True), ("b", 5, True)]
    eng.step()  # a and b finish here (max_tokens 2); c and d wait for a free slot
    assert eng.log[-1] == [("a", 1, True), ("b", 1, True)]
    eng.step()
    assert eng.log[-1] == [("c", 5, True), ("d", 5, True)]
    eng.run()
    for r in reqs:
        assert r.output_token_ids == expected_output(r.prompt_token_ids, 2)


def test_preempts_the_most_recent_request_when_blocks_run_out() -> None:
    sched = make_sched(num_blocks=4, budget=64, max_num_seqs=2, caching=False)
    eng = FakeEngine(sched)
    a, b = req("a", list(range(10, 18)), max_tokens=3), req("b", list(range(20, 26)), max_tokens=3)
    c = req("c", [3, 4], max_tokens=3)
    for r in (a, b, c):
        sched.add_request(r)
    eng.step()
    assert eng.log[-1] == [("a", 8, True), ("b", 6, True)]  # c waits for a sequence slot
    assert sched.block_manager.block_table("a") == [0, 1] and sched.block_manager.block_table("b") == [2, 3]
    b_out = list(b.output_token_ids)
    eng.step()  # a's 9th token needs a third block: b (admitted last) is preempted and recomputed later
    assert eng.preempted == ["b"] and eng.log[-1] == [("a", 1, True)]
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0 and b.num_preemptions == 1
    assert list(sched.waiting) == [b, c] and sched.running == [a]  # the preempted request goes first
    assert b.output_token_ids == b_out  # its sampled token is kept
    assert sched.block_manager.block_table("a") == [0, 1, 3] and sched.block_manager.block_table("b") == []
    assert sched.num_preemptions == 1
    eng.run()
    assert a.output_token_ids == expected_output(a.prompt_token_ids, 3)
    assert b.output_token_ids == expected_output(b.prompt_token_ids, 3)
    assert c.output_token_ids == expected_output(c.prompt_token_ids, 3)
    assert_all_free(sched.block_manager)


def test_a_request_that_cannot_grow_preempts_itself() -> None:
    sched = make_sched(num_blocks=4, budget=64, caching=False)
    eng = FakeEngine(sched)
    a, b = req("a", list(range(10, 16)), max_tokens=4), req("b", list(range(20, 28)), max_tokens=4)
    sched.add_request(a)
    sched.add_request(b)
    eng.step()
    eng.step()  # a: 7 tokens fits in 2 blocks; b: its 9th token needs a block and b itself is the last admitted
    assert eng.preempted == ["b"] and eng.log[-1] == [("a", 1, True)]
    eng.run()
    assert a.output_token_ids == expected_output(a.prompt_token_ids, 4)
    assert b.output_token_ids == expected_output(b.prompt_token_ids, 4)
    assert_all_free(sched.block_manager)


@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("budget", [7, 64])
def test_pressured_run_matches_unpressured_run(caching: bool, budget: int) -> None:
    """Many requests with shared prefixes through a tiny cache: preemptions happen, tokens don't change."""
    base = list(range(30, 43))
    prompts = [base + [i] * (i % 4) for i in range(6)] + [list(range(60, 60 + 3 * i + 1)) for i in range(4)]
    sched = make_sched(num_blocks=10, budget=budget, caching=caching)
    eng = FakeEngine(sched)
    reqs = [req(f"r{i}", p, max_tokens=12) for i, p in enumerate(prompts)]
    for r in reqs:
        sched.add_request(r)
    eng.run()
    assert sched.num_preemptions > 0
    for r in reqs:
        assert r.output_token_ids == expected_output(r.prompt_token_ids, 12)
    assert_all_free(sched.block_manager)
    if caching:
        assert sched.block_manager.prefix_hits > 0


def test_no_admission_without_blocks() -> None:
    sched = make_sched(num_blocks=3, budget=64, caching=False)
    eng = FakeEngine(sched)
    sched.add_request(req("a", [3] * 8, max_tokens=2))
    sched.add_request(req("b", [4] * 8, max_tokens=2))
    eng.step()
    assert eng.log[-1] == [("a", 8, True)] and len(sched.waiting) == 1
    eng.run()
    assert_all_free(sched.block_manager)


# ---- end to end on a tiny checkpoint ----

PROMPTS = [[5, 17, 42, 99, 7] * 4, list(range(100, 118)), [300, 12, 9], list(range(200, 213)),
           [5, 17, 42, 99, 7] * 3 + [1, 2]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
LEN = 32  # max_model_len: prompts of up to 20 tokens + 12 generated


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> str:
    # NOTE: one checkpoint per session, shared by the unit-test modules that need one (tokenizer.json is written last).
    folder = tmp_path_factory.getbasetemp() / "unit_tiny_llama"
    if not (folder / "tokenizer.json").exists():
        build_checkpoint(str(folder), tiny_config("llama"))
    return str(folder)


@pytest.fixture(scope="module")
def reference(tiny_llama: str) -> list[list[int]]:
    llm = LLM(tiny_llama, dtype="float32", max_model_len=LEN, block_size=4)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY)
    assert llm.engine.scheduler.num_preemptions == 0
    return [o.outputs[0].token_ids for o in outs]


def greedy_tokens(llm: LLM) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY)
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and all(b.ref_cnt == 0 for b in bm.blocks)
    return [o.outputs[0].token_ids for o in outs]


def test_preempted_run_gives_the_same_greedy_tokens(tiny_llama: str, reference: list[list[int]]) -> None:
    # 2 KiB per 4-token block for this model; 10 blocks hold 40 tokens, the 5 requests need 123.
    llm = LLM(tiny_llama, dtype="float32", max_model_len=LEN, block_size=4, kv_cache_space=10 * 2048 / 2**30)
    assert llm.engine.cache_config.num_blocks == 10
    assert greedy_tokens(llm) == reference
    assert llm.engine.scheduler.num_preemptions > 0


def test_chunked_prefill_run_gives_the_same_greedy_tokens(tiny_llama: str, reference: list[list[int]]) -> None:
    llm = LLM(tiny_llama, dtype="float32", max_model_len=LEN, max_num_batched_tokens=8, block_size=4)
    assert greedy_tokens(llm) == reference
    assert llm.engine.scheduler.num_preemptions == 0


def test_n2_shares_prompt_blocks(tiny_llama: str) -> None:
    llm = LLM(tiny_llama, dtype="float32", max_model_len=64)
    eng, bm = llm.engine, llm.engine.block_manager
    prompt = list(range(100, 120))  # 20 tokens: one full 16-token block
    eng.add_request("x", prompt, SamplingParams(n=2, temperature=0.0, max_tokens=4, ignore_eos=True))
    eng.step()
    t0, t1 = bm.block_table("x#0"), bm.block_table("x#1")
    assert t0[0] == t1[0] and t0[1] != t1[1]
    assert bm.blocks[t0[0]].ref_cnt == 2
    assert bm.prefix_hits == 16
    while eng.has_unfinished_requests():
        eng.step()
    assert bm.num_free_blocks == bm.num_blocks
    outs = llm.generate({"prompt_token_ids": prompt}, SamplingParams(n=2, temperature=0.0, max_tokens=4,
                                                                     ignore_eos=True))
    assert outs[0].outputs[0].token_ids == outs[0].outputs[1].token_ids
    assert outs[0].num_cached_tokens == 16


def test_prefix_counters_count_only_the_admitting_lookup() -> None:
    """A request that waits for blocks is looked up again every step; only the lookup that admits it counts."""
    bm = BlockManager(4, 4)
    sched = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64), bm)
    hog = Request("hog", list(range(12)), SamplingParams(max_tokens=4), [0])
    sched.add_request(hog)
    sched.commit(sched.schedule())  # 3 of 4 blocks
    waiter = Request("w", list(range(100, 110)), SamplingParams(max_tokens=4), [0])
    sched.add_request(waiter)
    for _ in range(3):
        out = sched.schedule()  # the waiter needs 3 blocks: stays waiting
        assert all(s.request is hog for s in out.scheduled)
        sched.commit(out)
    assert bm.prefix_queries == 12  # only the hog's admission
    sched.finish(hog, RequestStatus.FINISHED_STOPPED)
    sched.schedule()
    assert bm.prefix_queries == 22


def test_pooling_requests_share_the_queue_budget_and_slots() -> None:
    """Pooling requests wait in the one queue, in order, and spend the step's budget and sequence slots; each runs
    whole (never chunked) with its KV blocks held for the pass; one longer than the budget runs alone."""
    from hearth.pooling_params import PoolingParams

    def pooling(rid: str, n: int) -> Request:
        return Request(rid, list(range(2, 2 + n)), PoolingParams(), [])

    s = make_sched(64, budget=20, max_num_seqs=3)
    s.add_request(req("g", list(range(2, 10))))  # 8 prompt tokens
    for r in (pooling("p1", 6), pooling("p2", 6), pooling("p3", 2), pooling("big", 30)):
        s.add_request(r)
    out = s.schedule()
    assert [x.request.request_id for x in out.scheduled] == ["g"]
    assert [r.request_id for r in out.pooling] == ["p1", "p2"]  # p3 fits the budget but not the 3 slots
    assert out.num_tokens == 20
    assert all(len(s.block_manager.block_table(r.request_id)) == 2 for r in out.pooling)  # 6 tokens, 4 a block
    assert [r.request_id for r in s.waiting] == ["p3", "big"] and [r.request_id for r in s.running] == ["g"]
    s.requeue_pooling(out.pooling)  # a failed pass: back to the front, blocks freed
    assert [r.request_id for r in s.waiting] == ["p1", "p2", "p3", "big"]
    assert s.block_manager.num_used_blocks == 2  # g's only
    s.commit(out)
    g = s.running[0]
    g.append_output_token(5)  # (g sampled its first token: it decodes one a step from here)
    for r in out.pooling:
        s.block_manager.free(r.request_id)
    s.waiting.popleft(), s.waiting.popleft()  # (p1 and p2 ran)
    out = s.schedule()  # g decodes; p3 fits; big does not fit beside it
    assert [r.request_id for r in out.pooling] == ["p3"] and out.num_tokens == 1 + 2
    s.commit(out)
    g.append_output_token(5)
    s.block_manager.free("p3")
    out = s.schedule()  # big is this step's first pooling request: it runs past the budget, unsplit
    assert [r.request_id for r in out.pooling] == ["big"] and out.num_tokens == 1 + 30
    assert len(s.block_manager.block_table("big")) == 8
