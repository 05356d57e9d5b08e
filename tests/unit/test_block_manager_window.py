"""BlockManager with a sliding window: blocks wholly outside the window are released as requests advance and
their table entries become the null block (0); ref counts, prefix-cache hashes and the free list stay exact."""
from hearth import SamplingParams
from hearth.engine.block_manager import BlockManager, freeable_window
from hearth.engine.request import Request

BS = 4
W = 8  # a query at position p sees keys (p - 8, p]


def req(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(), eos_token_ids=[1])


def admit(bm: BlockManager, r: Request, num_new: int | None = None) -> list[int]:
    """Admit r the way the scheduler does (prefix lookup, allocate a first chunk); returns the hits."""
    hits, cached = bm.get_computed_blocks(r)
    r.num_computed_tokens = cached
    assert bm.allocate(r, num_new if num_new is not None else r.num_tokens - cached, hits)
    return hits


def step(bm: BlockManager, r: Request, num_new: int) -> None:
    """Commit the last scheduled chunk of num_new tokens, then allocate the next one token (a decode)."""
    r.num_computed_tokens += num_new
    if r.num_computed_tokens == r.num_tokens:
        r.append_output_token(7)
    assert bm.allocate(r, 1)


def held(bm: BlockManager, rid: str) -> list[int]:
    return [b for b in bm.block_table(rid) if b != 0]


def assert_all_free(bm: BlockManager) -> None:
    assert bm.blocks[0].ref_cnt == 1 and bm.blocks[0].block_hash is None  # the null block, forever
    assert [b.ref_cnt for b in bm.blocks[1:]] == [0] * (bm.num_blocks - 1)
    assert sorted(bm.free_block_ids()) == list(range(1, bm.num_blocks))
    assert bm.req_blocks == {} and bm.num_used_blocks == 0


def test_freeable_window_is_the_largest_window_unless_a_layer_is_global() -> None:
    assert freeable_window([16, 16]) == 16
    assert freeable_window([16, 32, 16]) == 32
    assert freeable_window([16, None]) is None
    assert freeable_window([0, 16]) is None  # 0: no window
    assert freeable_window([]) is None


def test_no_window_keeps_block_zero_allocatable() -> None:
    bm = BlockManager(4, BS)
    assert bm.null_block is None and bm.num_free_blocks == 4
    one = BlockManager(1, BS, sliding_window=W)  # no room for a null block: windowing off
    assert one.null_block is None and one.num_free_blocks == 1


def test_decode_releases_blocks_behind_the_window() -> None:
    bm = BlockManager(10, BS, sliding_window=W)
    assert bm.num_free_blocks == 9 and bm.num_used_blocks == 0 and bm.usage == 0.0
    r = req("a", list(range(100, 110)))  # 10 tokens: blocks for positions 0-3, 4-7, 8-11
    admit(bm, r)
    assert bm.block_table("a") == [1, 2, 3]
    step(bm, r, 10)  # computed 10: future queries need keys from 3 on -> block 0 still needed
    assert bm.block_table("a") == [1, 2, 3]
    step(bm, r, 1)  # computed 11: keys from 4 on -> positions 0-3 released
    assert bm.block_table("a") == [0, 2, 3]
    assert bm.blocks[1].ref_cnt == 0 and 1 in bm.free_blocks and bm.blocks[1].block_hash is not None
    assert bm.num_used_blocks == 2 and bm.usage == 2 / 9
    step(bm, r, 1)  # computed 12: a new block for position 12 (the released block 1: freed before never used)
    assert bm.block_table("a") == [0, 2, 3, 1]
    for _ in range(30):  # a long decode holds at most window / block_size + 2 blocks
        step(bm, r, 1)
        assert bm.num_held_blocks("a") <= W // BS + 2
        assert bm.num_used_blocks == bm.num_held_blocks("a")
    table = bm.block_table("a")
    assert len(table) == bm.blocks_needed(r.num_computed_tokens + 1)
    first_needed = r.num_computed_tokens - W + 1
    assert all(b == 0 for b in table[:first_needed // BS]) and 0 not in table[first_needed // BS:]
    bm.free("a")  # must not touch the null entries
    assert_all_free(bm)


def test_long_sequence_runs_in_a_cache_smaller_than_itself() -> None:
    bm = BlockManager(6, BS, sliding_window=W)  # 5 usable blocks = 20 tokens
    r = req("a", list(range(100, 106)))
    admit(bm, r)
    step(bm, r, 6)
    for _ in range(100):
        step(bm, r, 1)
    assert r.num_computed_tokens == 106 and bm.num_held_blocks("a") <= W // BS + 2
    bm.free("a")
    assert_all_free(bm)


def test_chunked_prefill_keeps_the_window_before_the_chunk() -> None:
    bm = BlockManager(16, BS, sliding_window=W)
    r = req("a", list(range(100, 130)))  # 30 tokens in chunks of 8
    admit(bm, r, 8)
    assert bm.block_table("a") == [1, 2]
    r.num_computed_tokens = 8
    assert bm.allocate(r, 8)  # chunk 8-15: its first query (8) needs keys 1-8: nothing released yet
    assert bm.block_table("a") == [1, 2, 3, 4]
    r.num_computed_tokens = 16
    assert bm.allocate(r, 8)  # chunk 16-23 needs keys from 9 on: positions 0-7 released, 8-11 kept
    assert bm.block_table("a") == [0, 0, 3, 4, 2, 1]  # the released blocks, newest first
    bm.free("a")
    assert_all_free(bm)


def test_released_blocks_stay_prefix_cache_hits() -> None:
    bm = BlockManager(16, BS, sliding_window=W)
    prompt = list(range(100, 121))  # 21 tokens: 5 full blocks
    a = req("a", prompt)
    admit(bm, a)
    assert bm.block_table("a") == [1, 2, 3, 4, 5, 6]
    step(bm, a, 21)  # computed 21: keys from 14 on -> blocks for 0-11 released
    assert bm.block_table("a") == [0, 0, 0, 4, 5, 6]
    bm.free("a")
    # A new request with the same prompt finds every full block, released ones included (never the null block).
    b = req("b", prompt)
    hits, cached = bm.get_computed_blocks(b)
    assert hits == [1, 2, 3, 4, 5] and cached == 20
    b.num_computed_tokens = cached
    assert bm.allocate(b, 1, hits)
    # Hits already outside b's window (computed 20: keys from 13 on) are not taken: they stay free and cached.
    # b's new block is the least recently freed one (freed blocks go before never-used ones): a's released
    # block 3, which leaves the prefix cache.
    assert bm.block_table("b") == [0, 0, 0, 4, 5, 3]
    assert [bm.blocks[i].ref_cnt for i in (1, 2, 3, 4, 5)] == [0, 0, 1, 1, 1]
    assert bm.num_used_blocks == 3
    bm.free("b")
    assert_all_free(bm)
    assert bm.get_computed_blocks(req("c", prompt))[0] == [1, 2]


def test_shared_prompt_blocks_keep_their_refs_until_every_sharer_moves_on() -> None:
    # Two sequences of one prompt (n=2 shares prompt blocks through the prefix cache).
    bm = BlockManager(24, BS, sliding_window=W)
    prompt = list(range(100, 113))  # 13 tokens: 3 full blocks
    x0, x1 = req("x#0", prompt), req("x#1", prompt)
    admit(bm, x0)
    hits = admit(bm, x1)
    assert hits == [1, 2, 3]
    # x1 starts at computed 12 (keys from 5 on): its hit on block 1 is not taken.
    assert bm.block_table("x#0") == [1, 2, 3, 4] and bm.block_table("x#1") == [0, 2, 3, 5]
    assert [bm.blocks[i].ref_cnt for i in (1, 2, 3)] == [1, 2, 2]
    step(bm, x0, 13)  # x0 computed 13: keys from 6 on -> x0 releases block 1
    step(bm, x1, 1)  # x1 computed 13 too
    assert bm.block_table("x#0")[:2] == [0, 2] and bm.block_table("x#1")[:2] == [0, 2]
    assert bm.blocks[1].ref_cnt == 0 and 1 in bm.free_blocks and bm.blocks[2].ref_cnt == 2
    for _ in range(4):
        step(bm, x0, 1)  # x0 runs ahead: x0 releases block 2, x1 still holds it
    assert bm.block_table("x#0")[:3] == [0, 0, 3] and bm.blocks[2].ref_cnt == 1 and 2 not in bm.free_blocks
    bm.free("x#1")  # preempted or finished: its null entries are skipped
    assert bm.blocks[2].ref_cnt == 0 and 2 in bm.free_blocks
    bm.free("x#0")
    assert_all_free(bm)


def test_preempted_request_is_recomputed_from_scratch() -> None:
    bm = BlockManager(16, BS, sliding_window=W)
    r = req("a", list(range(100, 110)))
    admit(bm, r)
    step(bm, r, 10)
    for _ in range(10):
        step(bm, r, 1)
    assert bm.block_table("a")[:3] == [0, 0, 0]
    bm.free("a")  # preemption: free everything, recompute later
    r.num_computed_tokens = 0
    # The decode reused its released blocks (freed before never-used ones), so the prompt's first blocks are no
    # longer cached: what hits is a prefix of the request's full blocks, the rest is recomputed.
    hits = admit(bm, r)
    assert len(hits) <= (r.num_tokens - 1) // BS
    assert bm.num_held_blocks("a") <= bm.blocks_needed(r.num_tokens)
    bm.free("a")
    assert_all_free(bm)


def test_can_allocate_counts_released_blocks_as_free() -> None:
    bm = BlockManager(5, BS, sliding_window=W)  # 4 usable blocks
    a = req("a", list(range(100, 113)))  # 13 tokens: 4 blocks, the whole cache
    admit(bm, a)
    assert bm.num_free_blocks == 0
    b = req("b", [5, 6, 7])
    assert not bm.can_allocate(b, 3)
    step(bm, a, 13)  # computed 13: block for 0-3 released
    assert bm.num_free_blocks == 1
    assert bm.can_allocate(b, 3) and bm.allocate(b, 3)
    assert bm.block_table("b") == [1]
