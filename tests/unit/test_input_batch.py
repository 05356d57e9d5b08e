"""The persistent decode batch (DecodeBatch) against the from-scratch inputs (prepare_inputs), step by step.

A scheduler runs requests with staggered prompt lengths and output lengths, late arrivals and (with few blocks)
preemptions; every decode-only step is prepared both ways, the decode batch carrying its arrays over from the
step before exactly as the model runner does, and the two must agree on everything attention reads.
"""
import random

import numpy as np
import pytest
import torch

from hearth import SamplingParams
from hearth.config import SchedulerConfig
from hearth.engine.block_manager import BlockManager
from hearth.engine.input_batch import DecodeBatch, SeqInput, prepare_inputs
from hearth.engine.request import Request, RequestStatus
from hearth.engine.scheduler import Scheduler

BS = 4


def _reference_all_decodes(sched_out) -> bool:
    return bool(sched_out.scheduled) and all(
        s.num_new_tokens == 1 and s.sample and not s.spec_token_ids
        and s.request.num_computed_tokens >= max(1, s.request.num_prompt_tokens) for s in sched_out.scheduled)


def _check_same(got, want) -> None:
    (ids, pos, meta), (ids_ref, pos_ref, meta_ref) = got, want
    assert ids.tolist() == ids_ref.tolist()
    assert pos.tolist() == pos_ref.tolist()
    assert meta.slot_mapping.tolist() == meta_ref.slot_mapping.tolist()
    assert meta.context_lens.tolist() == meta_ref.context_lens.tolist()
    assert meta.query_start_loc.tolist() == meta_ref.query_start_loc.tolist()
    assert meta.num_decode_tokens == meta_ref.num_decode_tokens and meta.prefills == [] == meta_ref.prefills
    assert meta.block_tables.dtype == torch.int32 and meta.block_tables.is_contiguous()
    for row, ref, ctx in zip(meta.block_tables.tolist(), meta_ref.block_tables.tolist(), meta.context_lens.tolist()):
        used = -(-ctx // BS)  # the entries attention reads
        assert row[:used] == ref[:used]


@pytest.mark.parametrize("num_blocks", [400, 40])  # 40: preemptions
def test_decode_batch_matches_inputs_built_from_scratch(num_blocks: int) -> None:
    rng = random.Random(num_blocks)
    sched = Scheduler(SchedulerConfig(max_num_seqs=12, max_num_batched_tokens=64, max_model_len=256),
                      BlockManager(num_blocks, BS, True))
    bm = sched.block_manager
    batch = DecodeBatch(BS)
    sampled: torch.Tensor | None = None
    next_id, decode_steps, carried = 0, 0, 0
    for step in range(400):
        if step % 25 == 0 and next_id < 30:  # arrivals in waves: decode batches change membership
            for _ in range(rng.randrange(1, 6)):
                prompt = [rng.randrange(2, 500) for _ in range(rng.randrange(1, 23))]
                params = SamplingParams(temperature=0.0, max_tokens=rng.randrange(1, 60))
                sched.add_request(Request(f"r{next_id}", prompt, params, eos_token_ids=[1]))
                next_id += 1
        if not sched.has_unfinished():
            continue
        out = sched.schedule()
        assert out.all_decodes == _reference_all_decodes(out)
        if out.all_decodes:
            reqs = [s.request for s in out.scheduled]
            carried += reqs == batch.reqs
            want = prepare_inputs([SeqInput([r.all_token_ids[r.num_computed_tokens]], r.num_computed_tokens,
                                            bm.block_table(r.request_id)) for r in reqs], BS)
            _check_same(batch.prepare(reqs, bm.block_table, sampled), want)
            decode_steps += 1
        else:
            batch.reset()
        sched.commit(out)
        tokens = []
        for s in out.scheduled:
            r = s.request
            if s.sample:
                tokens.append(rng.randrange(2, 500))
                r.append_output_token(tokens[-1])
        sampled = torch.tensor(tokens, dtype=torch.long) if out.all_decodes else None
        for s in out.scheduled:
            r = s.request
            if s.sample and r.num_output_tokens >= r.params.max_tokens:
                sched.finish(r, RequestStatus.FINISHED_LENGTH)
    assert decode_steps > 100 and carried > 50  # both paths ran, and many steps carried the arrays over
    if num_blocks == 40:
        assert sched.num_preemptions > 0


def test_decode_batch_grows_rows_and_columns() -> None:
    batch = DecodeBatch(BS)
    bm = BlockManager(600, BS, False)
    reqs = [Request(f"r{i}", [5] * (3 + i), SamplingParams(max_tokens=100), eos_token_ids=[1]) for i in range(20)]
    for r in reqs:  # prompts computed, one output token each: decodes from here
        assert bm.allocate(r, r.num_tokens)
        r.num_computed_tokens = r.num_tokens
        r.append_output_token(7)
    sampled = None
    for _ in range(60):  # up to 82 tokens = 21 blocks of 4: past the initial 8 columns
        for r in reqs:
            assert bm.allocate(r, 1)
        ids, pos, meta = batch.prepare(reqs, bm.block_table, sampled)
        assert pos.tolist() == [r.num_computed_tokens for r in reqs]
        want = [bm.block_table(r.request_id)[p // BS] * BS + p % BS for r, p in zip(reqs, pos.tolist())]
        assert meta.slot_mapping.tolist() == want
        assert ids.tolist() == [r.all_token_ids[-1] for r in reqs]
        for r in reqs:
            r.num_computed_tokens += 1
            r.append_output_token(r.num_tokens % 97)
        sampled = torch.tensor([r.all_token_ids[-1] for r in reqs])
    assert batch.block_tables.shape[1] >= 21 and batch.context_lens.shape[0] >= 20
    np.testing.assert_array_equal(batch.context_lens[:20], [r.num_computed_tokens for r in reqs])
