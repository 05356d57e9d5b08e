"""BlockManager: exact block ids, prefix-cache hits, chained hashes, eviction order, ref counts."""
import pytest

from hearth import LLM, SamplingParams
from hearth.engine import block_manager as bm_mod
from hearth.engine.block_manager import BlockManager, hash_block
from hearth.engine.request import Request
from tests.tiny_models import build_checkpoint, tiny_config

BS = 4


def req(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(), eos_token_ids=[1])


def prefill(bm: BlockManager, r: Request) -> list[int]:
    """Admit r the way the scheduler does (prefix lookup, allocate the rest) and mark its prompt computed."""
    hits, cached = bm.get_computed_blocks(r)
    r.num_computed_tokens = cached
    assert bm.allocate(r, r.num_tokens - cached, hits)
    r.num_computed_tokens = r.num_tokens
    return hits


def decode(bm: BlockManager, r: Request, token: int) -> None:
    r.append_output_token(token)
    assert bm.allocate(r, 1)
    r.num_computed_tokens += 1


def assert_all_free(bm: BlockManager) -> None:
    assert [b.ref_cnt for b in bm.blocks] == [0] * bm.num_blocks
    assert bm.num_free_blocks == bm.num_blocks
    assert sorted(bm.free_block_ids()) == list(range(bm.num_blocks))
    assert bm.req_blocks == {}


def test_allocation_gives_exact_ids_in_order() -> None:
    bm = BlockManager(8, BS)
    a = req("a", list(range(100, 110)))  # 10 tokens -> 3 blocks
    b = req("b", list(range(200, 205)))  # 5 tokens -> 2 blocks
    prefill(bm, a)
    prefill(bm, b)
    assert bm.block_table("a") == [0, 1, 2]
    assert bm.block_table("b") == [3, 4]
    assert bm.num_free_blocks == 3 and bm.num_used_blocks == 5
    # Decoding fills a's third block (tokens 10, 11), then opens block 5 at token 12.
    decode(bm, a, 7)
    decode(bm, a, 7)
    assert bm.block_table("a") == [0, 1, 2]
    decode(bm, a, 7)
    assert bm.block_table("a") == [0, 1, 2, 5]
    decode(bm, b, 9)  # b: 6 tokens, still 2 blocks
    assert bm.block_table("b") == [3, 4]
    assert [blk.ref_cnt for blk in bm.blocks] == [1, 1, 1, 1, 1, 1, 0, 0]
    bm.free("a")
    bm.free("b")
    assert_all_free(bm)


def test_allocate_fails_cleanly_when_out_of_blocks() -> None:
    bm = BlockManager(3, BS)
    a = req("a", list(range(100, 113)))  # 13 tokens -> 4 blocks > 3
    assert not bm.can_allocate(a, 13)
    assert not bm.allocate(a, 13)
    assert bm.block_table("a") == [] and bm.num_free_blocks == 3
    assert_all_free(bm)


def test_prefix_hit_full_blocks_only_and_last_token_recomputed() -> None:
    bm = BlockManager(16, BS)
    prompt = list(range(100, 110))  # 10 tokens: 2 full blocks + 2 tokens
    a = req("a", prompt)
    assert prefill(bm, a) == []
    assert bm.block_table("a") == [0, 1, 2]
    b = req("b", prompt)
    hits, cached = bm.get_computed_blocks(b)
    assert (hits, cached) == ([0, 1], 8)
    b.num_computed_tokens = cached
    assert bm.allocate(b, b.num_tokens - cached, hits)
    assert bm.block_table("b") == [0, 1, 3]  # shared full blocks, own partial block
    assert [blk.ref_cnt for blk in bm.blocks[:4]] == [2, 2, 1, 1]
    assert (bm.prefix_queries, bm.prefix_hits) == (0, 0)  # the scheduler records lookups that admit a request
    bm.free("a")
    assert [blk.ref_cnt for blk in bm.blocks[:4]] == [1, 1, 0, 1]
    bm.free("b")
    assert_all_free(bm)


def test_prompt_that_is_a_multiple_of_block_size_hits_all_but_last_block() -> None:
    bm = BlockManager(16, BS)
    prompt = list(range(100, 112))  # exactly 3 blocks
    a = req("a", prompt)
    prefill(bm, a)
    assert bm.block_table("a") == [0, 1, 2]
    b = req("b", prompt)
    hits = prefill(bm, b)
    assert hits == [0, 1]  # the last block holds the last token, whose logits are needed: recomputed
    assert bm.block_table("b") == [0, 1, 3]
    # A one-token prompt never hits anything.
    c, d = req("c", [5]), req("d", [5])
    prefill(bm, c)
    assert bm.get_computed_blocks(d) == ([], 0)
    for r in ("a", "b", "c"):
        bm.free(r)
    assert_all_free(bm)


def test_outputs_are_cached_too_and_a_longer_prompt_hits_them() -> None:
    bm = BlockManager(16, BS)
    a = req("a", [10, 11, 12, 13, 14, 15])  # 6 tokens
    prefill(bm, a)
    decode(bm, a, 16)
    decode(bm, a, 17)  # a's tokens 10..17: blocks 0 and 1 both full now
    bm.free("a")
    b = req("b", [10, 11, 12, 13, 14, 15, 16, 17, 18])
    assert bm.get_computed_blocks(b) == ([0, 1], 8)


def test_hashes_chain_so_same_block_after_a_different_prefix_misses() -> None:
    x, y, z = [1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]
    hx, hz = hash_block(None, tuple(x)), hash_block(None, tuple(z))
    assert hash_block(hx, tuple(y)) != hash_block(hz, tuple(y))

    bm = BlockManager(16, BS)
    a = req("a", x + y + [42])
    b = req("b", z + y + [42])
    prefill(bm, a)
    assert prefill(bm, b) == []  # y after z is not y after x
    assert bm.block_table("a") == [0, 1, 2] and bm.block_table("b") == [3, 4, 5]
    assert len(bm.cached) == 4  # x, x+y, z, z+y: four distinct prefixes
    c = req("c", x + y + [43])
    assert bm.get_computed_blocks(c) == ([0, 1], 8)
    d = req("d", z + y + [43])
    assert bm.get_computed_blocks(d) == ([3, 4], 8)
    e = req("e", y + y + [43])  # y as the first block was never cached
    assert bm.get_computed_blocks(e) == ([], 0)


def test_hash_collision_is_caught_by_token_compare(monkeypatch) -> None:
    monkeypatch.setattr(bm_mod, "hash_block", lambda parent, tokens, extra=(): 12345)  # every block collides
    bm = BlockManager(16, BS)
    a = req("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    prefill(bm, a)
    assert bm.cached == {12345: 0}
    other = req("o", [11, 12, 13, 14, 15, 16, 17, 18, 19])
    assert bm.get_computed_blocks(other) == ([], 0)  # same hash, different tokens: a miss
    same_start = req("s", [1, 2, 3, 4, 15, 16, 17, 18, 19])
    # Block 0 really matches; block 1's hash points at block 0 whose tokens differ: stop there.
    assert bm.get_computed_blocks(same_start) == ([0], 4)
    prefill(bm, other)
    assert bm.block_table("o") == [3, 4, 5]
    bm.free("a")
    bm.free("o")
    assert_all_free(bm)


def test_image_blocks_are_keyed_by_the_image_hash(monkeypatch) -> None:
    """Blocks holding an image's placeholder tokens match only the same image's: the same tokens with another
    image (another pixel hash) miss from the first such block on, even when the hashes collide."""
    import torch

    from hearth.multimodal.inputs import ImageInput

    def with_image(rid: str, mm_hash: str) -> Request:
        r = req(rid, [7, 8, 9, 5, 5, 5, 5, 5, 5, 3, 4])  # the image fills positions 3..8
        r.mm_inputs = [ImageInput(torch.zeros(1), 3, 6, mm_hash)]
        return r

    bm = BlockManager(16, BS)
    prefill(bm, with_image("a", "cat"))
    bm.free("a")
    assert bm.get_computed_blocks(with_image("same", "cat")) == ([0, 1], 8)
    assert bm.get_computed_blocks(with_image("other", "dog")) == ([], 0)  # block 0 holds position 3
    monkeypatch.setattr(bm_mod, "hash_block", lambda parent, tokens, extra=(): 12345)
    bm2 = BlockManager(16, BS)
    prefill(bm2, with_image("a", "cat"))
    assert bm2.get_computed_blocks(with_image("other", "dog")) == ([], 0)  # the extra keys are compared too


def test_free_is_tail_first_and_eviction_is_lru() -> None:
    bm = BlockManager(8, BS)
    prompt = list(range(100, 117))  # 17 tokens -> blocks 0..4, blocks 0..3 full and cached
    a = req("a", prompt)
    prefill(bm, a)
    assert bm.block_table("a") == [0, 1, 2, 3, 4]
    bm.free("a")
    # a's blocks tail first (the end of a prefix is evicted before its start), then the never-used blocks.
    assert bm.free_block_ids() == [4, 3, 2, 1, 0, 5, 6, 7]
    assert set(bm.cached.values()) == {0, 1, 2, 3}

    b = req("b", list(range(200, 204)))  # 4 tokens -> 1 block: a's uncached tail block, no cache entry lost
    prefill(bm, b)
    assert bm.block_table("b") == [4] and set(bm.cached.values()) == {0, 1, 2, 3, 4}
    c = req("c", prompt)
    assert bm.get_computed_blocks(c) == ([0, 1, 2, 3], 16)
    bm.free("b")
    assert bm.free_block_ids() == [3, 2, 1, 0, 4, 5, 6, 7]

    # A hit takes blocks out of the free list; freeing them again makes them most recently used.
    prefill(bm, c)
    assert bm.block_table("c") == [0, 1, 2, 3, 4]
    bm.free("c")
    assert bm.free_block_ids() == [4, 3, 2, 1, 0, 5, 6, 7]
    assert_all_free(bm)


def test_freed_blocks_are_reused_before_never_used_ones() -> None:
    """RSS follows the working set: requests that come and go one at a time keep reusing the same blocks."""
    bm = BlockManager(64, BS)
    for i in range(50):
        r = req(f"r{i}", [1000 + i] * 9)  # 3 blocks each, distinct prompts
        prefill(bm, r)
        bm.free(r.request_id)
    assert list(bm.fresh) == list(range(3, 64))  # only blocks 0..2 were ever handed out
    assert sorted(bm.free_blocks) == [0, 1, 2] and bm.num_free_blocks == 64


def test_can_allocate_counts_hits_in_the_free_list() -> None:
    bm = BlockManager(3, BS)
    prompt = list(range(100, 109))  # 9 tokens -> blocks 0, 1 (full, cached) and 2
    a = req("a", prompt)
    prefill(bm, a)
    bm.free("a")
    assert bm.num_free_blocks == 3

    # 13 tokens sharing a's first two blocks: 2 hits + 2 new = 4 blocks > 3. The hits sit in the free list,
    # so they are not also free for the new blocks.
    big = req("big", prompt[:8] + [50, 51, 52, 53, 54])
    hits, cached = bm.get_computed_blocks(big)
    assert (hits, cached) == ([0, 1], 8)
    big.num_computed_tokens = cached
    assert not bm.can_allocate(big, 5, hits)
    assert not bm.allocate(big, 5, hits)
    assert bm.block_table("big") == [] and bm.num_free_blocks == 3

    # The same prompt again: 2 hits + 1 new block fits exactly.
    again = req("again", prompt)
    hits, cached = bm.get_computed_blocks(again)
    again.num_computed_tokens = cached
    assert bm.can_allocate(again, 1, hits)
    assert bm.allocate(again, 1, hits)
    assert bm.block_table("again") == [0, 1, 2]
    assert bm.num_free_blocks == 0
    bm.free("again")
    assert_all_free(bm)


def test_can_allocate_with_hits_held_by_a_running_request() -> None:
    bm = BlockManager(4, BS)
    prompt = list(range(100, 109))  # 3 blocks
    a = req("a", prompt)
    prefill(bm, a)
    b = req("b", prompt)
    hits, cached = bm.get_computed_blocks(b)
    assert hits == [0, 1]
    b.num_computed_tokens = cached
    # Hits in use cost nothing: b needs 1 new block, and 1 is free.
    assert bm.can_allocate(b, 1, hits)
    assert bm.allocate(b, 1, hits)
    assert bm.block_table("b") == [0, 1, 3]
    assert [blk.ref_cnt for blk in bm.blocks] == [2, 2, 1, 1]
    bm.free("b")
    bm.free("a")
    assert_all_free(bm)


def test_prefix_caching_disabled() -> None:
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    prompt = list(range(100, 109))
    prefill(bm, req("a", prompt))
    assert prefill(bm, req("b", prompt)) == []
    assert bm.block_table("b") == [3, 4, 5]
    assert bm.cached == {}
    bm.free("a")
    bm.free("b")
    assert_all_free(bm)


def test_reset_prefix_cache_forgets_free_blocks() -> None:
    bm = BlockManager(8, BS)
    prompt = list(range(100, 109))
    prefill(bm, req("a", prompt))
    bm.free("a")
    bm.reset_prefix_cache()
    assert bm.get_computed_blocks(req("b", prompt)) == ([], 0)
    assert all(b.block_hash is None for b in bm.blocks)


# ---- through the engine: ref counts back to zero after finished and aborted requests ----

@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> str:
    # NOTE: one checkpoint per session, shared by the unit-test modules that need one (tokenizer.json is written last).
    folder = tmp_path_factory.getbasetemp() / "unit_tiny_llama"
    if not (folder / "tokenizer.json").exists():
        build_checkpoint(str(folder), tiny_config("llama"))
    return str(folder)


def assert_engine_clean(llm: LLM) -> None:
    eng = llm.engine
    assert_all_free(eng.block_manager)
    assert not eng.scheduler.running and not eng.scheduler.waiting
    assert eng.seqs == {} and eng.parents == {}


def test_engine_frees_every_block_after_finish_and_abort(tiny_llama: str) -> None:
    llm = LLM(tiny_llama, dtype="float32", max_model_len=64, block_size=4, max_num_batched_tokens=8)
    eng = llm.engine
    shared = list(range(20, 33))  # 13 tokens: 3 full blocks
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": shared}, {"prompt_token_ids": shared + [7]}], greedy)
    assert [len(o.outputs[0].token_ids) for o in outs] == [6, 6]
    assert_engine_clean(llm)

    # Abort while running (mid chunked prefill and while decoding), while waiting, and an n=2 request.
    eng.add_request("run", list(range(60, 80)), SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
    eng.add_request("pair", shared + [9, 9], SamplingParams(n=2, temperature=0.0, max_tokens=20, ignore_eos=True))
    eng.add_request("wait", list(range(40, 50)), SamplingParams(max_tokens=20, ignore_eos=True))
    assert eng.step() == []  # budget 8: "run" gets its first 8-token chunk only, nothing is sampled
    assert len(eng.block_manager.block_table("run")) == 2
    assert eng.seqs["run"].request.num_computed_tokens == 8
    eng.abort_request("run")
    assert eng.block_manager.block_table("run") == []
    for _ in range(6):
        eng.step()
    assert eng.block_manager.num_used_blocks > 0
    eng.abort_request("pair")
    eng.abort_request("wait")
    eng.abort_request("unknown")  # ignored
    assert not eng.has_unfinished_requests()
    assert_engine_clean(llm)


def test_decode_registers_each_block_once_it_is_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode step that neither needs a block nor fills one takes the fast path (no hashing, no rescan of the
    table); every block is registered in the prefix cache on the step that fills it."""
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    a = req("a", [5, 6, 7])  # less than one block
    prefill(bm, a)
    calls: list[int] = []
    real = bm._full_block_hashes
    monkeypatch.setattr(bm, "_full_block_hashes", lambda r, n: calls.append(n) or real(r, n))
    for i in range(4 * BS):
        decode(bm, a, 10 + i)
        full = a.num_tokens // BS
        registered = [bm.blocks[b].block_hash for b in bm.block_table("a")[:full]]
        assert registered == real(a, a.num_tokens) and all(h in bm.cached for h in registered)
    # only when a block fills (n % BS == 0) or the next one is taken (n % BS == 1), not on every step
    assert calls == [n for n in range(4, 4 + 4 * BS) if n % BS in (0, 1)]
    b = req("b", a.all_token_ids[: 3 * BS] + [99])  # shares three full blocks
    hits, cached = bm.get_computed_blocks(b)
    assert hits == bm.block_table("a")[:3] and cached == 3 * BS
