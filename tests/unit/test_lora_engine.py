"""LoRA in the engine, without a reference model: the delta is added after whatever kernel the base layer runs
(a quantized one here) to its adapter's rows only; the pool's slots and CPU cache evict least recently used and
never drop an adapter a request in flight uses; the scheduler keeps a step's adapters within --max-loras; the
prefix cache never shares a block between adapters; requests under an adapter the engine cannot serve are refused."""
from __future__ import annotations

import pytest
import torch

from hearth import LLM, SamplingParams
from hearth.config import EngineArgs, LoRAConfig, SchedulerConfig
from hearth.engine.block_manager import BlockManager
from hearth.engine.lora_pool import LoRAPool
from hearth.engine.request import Request
from hearth.engine.scheduler import Scheduler
from hearth.errors import LoRAError, ParamError
from hearth.layers.lora import LoRALinear, LoRARows, SlotWeights
from hearth.layers.quant_linear import QuantLinear
from hearth.loader.model_loader import load_model
from hearth.lora.request import LoRARequest
from hearth.pooling_params import PoolingParams
from tests.lora_adapters import ab, write_adapter
from tests.tiny_models import build_checkpoint, tiny_config

HIDDEN, Q = 64, 64


def test_the_delta_is_added_after_a_quantized_kernel_to_its_rows_only() -> None:
    torch.manual_seed(0)
    base = QuantLinear(64, 96, shard_sizes={"q": 64, "k": 16, "v": 16}, scheme="int8")
    for shard, rows in (("q", 64), ("k", 16), ("v", 16)):
        base.load_shard("weight", shard, torch.randn(rows, 64))
    assert base.qweight is not None
    rows = LoRARows()
    layer = LoRALinear(base, rows, max_loras=2)
    w0, w1 = SlotWeights(torch.randn(4, 64), torch.randn(96, 4)), SlotWeights(torch.randn(8, 64), torch.randn(96, 8))
    layer.slots = [w0, w1]
    x = torch.randn(6, 64)
    plain = base(x)
    with rows.use([(0, slice(1, 3), 1.0), (1, torch.tensor([0, 5]), 1.0)]):  # rows 3, 4: the base model
        y = layer(x)
    expect = plain.clone()
    expect[1:3] += x[1:3] @ w0.a.T @ w0.b.T
    expect[[0, 5]] += x[[0, 5]] @ w1.a.T @ w1.b.T
    torch.testing.assert_close(y, expect)
    torch.testing.assert_close(layer(x), plain)  # outside a step with adapter rows: the base alone


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    return build_checkpoint(str(tmp_path_factory.mktemp("base")), tiny_config("llama"))


@pytest.fixture(scope="module")
def adapters(base, tmp_path_factory) -> list[LoRARequest]:
    root = tmp_path_factory.mktemp("adapters")
    return [LoRARequest(f"a{i}", i, write_adapter(root / f"a{i}", {"model.layers.0.self_attn.q_proj":
                                                                   ab(4, HIDDEN, Q)})) for i in range(1, 5)]


def make_pool(base: str, max_loras: int, max_cpu_loras: int) -> LoRAPool:
    model = load_model(EngineArgs(model=base, dtype="float32")).model
    return LoRAPool(model, LoRAConfig(max_loras, 16, max_cpu_loras), torch.float32)


def test_row_groups_slot_reuse_and_cache_eviction(base, adapters) -> None:
    a1, a2, a3, a4 = adapters
    pool = make_pool(base, max_loras=2, max_cpu_loras=3)
    for rid, lora in (("r1", a1), ("r2", a2), ("r2b", a2)):
        pool.acquire(rid, lora)
    # rows in step order: r1 (3 rows), a base request (1), r2 (1), r2b (2): a2's rows are contiguous, a1's too
    groups = pool.row_groups([(1, 1.0, 3), (0, 1.0, 1), (2, 1.0, 1), (2, 1.0, 2)])
    assert [(s, (r.start, r.stop)) for s, r, _ in groups] == [(0, (0, 3)), (1, (4, 7))]
    groups = pool.row_groups([(2, 1.0, 1), (1, 1.0, 1), (2, 1.0, 1)])  # a2's rows are split: indices
    assert groups[0][0] == 1 and groups[0][1].tolist() == [0, 2] and groups[1] == (0, slice(1, 2), 1.0)
    q = "model.layers.0.self_attn.qkv_proj"
    assert pool.layers[q].slots[0] is pool.loaded[1][1][q]
    # a3 takes the slot of the least recently used adapter this step does not use (a1's, slot 0)
    pool.acquire("r3", a3)
    groups = pool.row_groups([(2, 1.0, 1), (3, 1.0, 1)])
    assert dict(pool.slot_of) == {2: 1, 3: 0} and pool.layers[q].slots[0] is pool.loaded[3][1][q]
    # the cache holds 3: a4 loads while a1, a2, a3 are in use (nothing idle to drop), then idle ones go LRU first
    pool.acquire("r4", a4)
    assert list(pool.loaded) == [1, 2, 3, 4]
    pool.release("r1")
    assert list(pool.loaded) == [2, 3, 4] and 1 in pool.registered  # dropped, still registered: read again
    pool.release("r2")  # a2 still has r2b
    assert 2 in pool.loaded
    pool.release("r3")
    pool.release("r3")  # (idempotent)
    assert list(pool.loaded) == [2, 3, 4] and pool.users == {2: 1, 4: 1}
    pool.add(a1)  # registered again: loaded, and the idle a3 goes
    assert list(pool.loaded) == [2, 4, 1] and 3 not in pool.slot_of
    assert pool.layers[q].slots[0] is None  # a3's slot is empty now
    # removed while in use: it stays until its last request ends
    assert pool.remove(4) and 4 in pool.loaded
    pool.release("r4")
    assert 4 not in pool.loaded and not pool.remove(4)
    with pytest.raises(LoRAError, match="already 'a2'"):
        pool.add(LoRARequest("other", 2, a1.lora_path))


def req(rid: str, tokens: list[int], lora_id: int = 0) -> Request:
    return Request(rid, tokens, SamplingParams(temperature=0.0, max_tokens=4), [1], lora_id=lora_id)


def test_the_scheduler_keeps_a_steps_adapters_within_max_loras() -> None:
    sched = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64, max_loras=2),
                      BlockManager(64, 4))
    for r in (req("a", [5, 6], 1), req("b", [7, 8], 2), req("c", [9, 10], 3), req("d", [11], 1), req("e", [12])):
        sched.add_request(r)
    out = sched.schedule()
    # c (a third adapter) waits; d (adapter 1, already running) and e (the base) go past it
    assert [s.request.request_id for s in out.scheduled] == ["a", "b", "d", "e"]
    assert [r.request_id for r in sched.waiting] == ["c"]
    sched.commit(out)
    for rid in ("a", "d"):
        sched.finish(next(r for r in sched.running if r.request_id == rid), sched.running[0].status.FINISHED_STOPPED)
    assert "c" in [s.request.request_id for s in sched.schedule().scheduled]  # adapter 1's slot is free now


def test_the_prefix_cache_keys_blocks_by_adapter() -> None:
    bm = BlockManager(32, 4)
    prompt = list(range(10, 19))  # two full blocks and a token
    tables = {}
    for rid, lora_id in (("base", 0), ("a1", 1), ("a2", 2)):
        r = req(rid, prompt, lora_id)
        hits, cached = bm.get_computed_blocks(r)
        assert hits == [] and cached == 0, f"{rid} hit another adapter's blocks"
        r.num_computed_tokens = 0
        assert bm.allocate(r, r.num_tokens)
        tables[rid] = bm.block_table(rid)
    assert len({b for t in tables.values() for b in t}) == 9  # nine distinct blocks
    again = req("a1-again", prompt, 1)
    assert bm.get_computed_blocks(again) == (tables["a1"][:2], 8)  # the same adapter shares its prefix


def test_requests_under_an_adapter_need_enable_lora_and_generation(base, adapters) -> None:
    llm = LLM(base, dtype="float32", kv_cache_space=0.02)
    with pytest.raises(ParamError, match="--enable-lora"):
        llm.generate([1, 2, 3], SamplingParams(max_tokens=2), lora_request=adapters[0])
    llm = LLM(base, dtype="float32", kv_cache_space=0.02, enable_lora=True, max_loras=2)
    with pytest.raises(LoRAError, match="no such folder"):
        llm.generate([[1, 2, 3], [4, 5]], SamplingParams(max_tokens=2),
                     lora_request=[adapters[0], LoRARequest("gone", 9, "/nonexistent/adapter")])
    assert not llm.engine.has_unfinished_requests() and llm.engine.lora.users == {}  # nothing of it queued
    with pytest.raises(ParamError, match="not to embeddings"):
        llm.engine.add_request("e", [1, 2], PoolingParams(), lora_request=adapters[0])
    out = llm.generate([[1, 2, 3]] * 2, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                       lora_request=[adapters[0], None])
    assert all(len(o.outputs[0].token_ids) == 4 for o in out) and llm.engine.lora.users == {}


def test_the_decode_program_runs_only_steps_without_adapter_rows(base, adapters, monkeypatch) -> None:
    """--enable-lora keeps the whole-stack decode program for base-only steps (it has no LoRA deltas); a step with
    adapter rows runs layer by layer, and the base tokens are the same either way."""
    from hearth.kernels import decoder

    llm = LLM(base, dtype="float32", kv_cache_space=0.02, enable_lora=True)
    if llm.engine.model.model._decode_program() is None:
        pytest.skip("hearth kernels unavailable here")
    runs = []
    real = decoder.DecodeProgram.run
    monkeypatch.setattr(decoder.DecodeProgram, "run", lambda self, *a, **kw: runs.append(1) or real(self, *a, **kw))
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    base_tokens = llm.generate([[3, 4, 5]], greedy)[0].outputs[0].token_ids
    assert runs, "a base-only decode did not use the decode program"
    runs.clear()
    mixed = llm.generate([[3, 4, 5], [3, 4, 5]], greedy, lora_request=[None, adapters[0]])
    assert not runs and mixed[0].outputs[0].token_ids == base_tokens


def test_speculative_decoding_and_structured_output_under_an_adapter(base, adapters) -> None:
    """n-gram speculation verifies its drafts under the request's adapter (greedy tokens unchanged), and a grammar
    constrains an adapter's output as it does the base's."""
    from hearth.structured.params import StructuredOutputsParams

    prompt = [7, 8, 9, 10, 7, 8, 9, 10, 7, 8, 9]
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    plain = LLM(base, dtype="float32", kv_cache_space=0.02, enable_lora=True, max_loras=2)
    want = [o.outputs[0].token_ids for o in plain.generate([prompt] * 2, greedy, lora_request=[adapters[1], None])]
    spec = LLM(base, dtype="float32", kv_cache_space=0.02, enable_lora=True, max_loras=2,
               speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                                   "prompt_lookup_min": 1})
    got = [o.outputs[0].token_ids for o in spec.generate([prompt] * 2, greedy, lora_request=[adapters[1], None])]
    assert got == want and want[0] != want[1]
    assert spec.engine.speculator.stats.num_drafts > 0
    regex = SamplingParams(temperature=0.0, max_tokens=8,
                           structured_outputs=StructuredOutputsParams(regex="[a-c]{3,6}"))
    text = plain.generate([prompt], regex, lora_request=adapters[1])[0].outputs[0].text
    assert 3 <= len(text) <= 6 and set(text) <= set("abc")
