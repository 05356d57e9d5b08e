"""Scheduler fairness: one request's n sequences cannot take every slot, and --scheduling-policy priority."""
from hearth import SamplingParams
from hearth.config import SchedulerConfig
from hearth.engine.block_manager import BlockManager
from hearth.engine.request import Request, RequestStatus
from hearth.engine.scheduler import Scheduler


def make(max_num_seqs: int, per_request: int | None = None, policy: str = "fcfs") -> Scheduler:
    return Scheduler(SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=512, max_model_len=256,
                                     max_num_seqs_per_request=per_request, scheduling_policy=policy),
                     BlockManager(256, 4))


def seq(rid: str, group: str, priority: int = 0, arrival: float = 0.0) -> Request:
    r = Request(rid, [5, 6, 7], SamplingParams(max_tokens=4, priority=priority), eos_token_ids=[1],
                arrival_time=arrival)
    r.group_id = group
    return r


def test_a_large_n_holds_at_most_its_share_and_a_later_request_is_admitted_past_it() -> None:
    s = make(max_num_seqs=8, per_request=2)
    for i in range(8):
        s.add_request(seq(f"big#{i}", "big"))
    s.add_request(seq("small", "small"))
    out = s.schedule()
    assert [x.request.request_id for x in out.scheduled] == ["big#0", "big#1", "small"]
    assert len(s.waiting) == 6  # the other big sequences wait their turn
    s.commit(out)
    s.finish(s.running[0], RequestStatus.FINISHED_STOPPED)
    out = s.schedule()
    assert [x.request.request_id for x in out.scheduled if x.request.num_computed_tokens == 0] == ["big#2"]


def test_default_share_is_a_quarter_of_the_slots() -> None:
    assert SchedulerConfig(max_num_seqs=64).max_num_seqs_per_request == 16
    assert SchedulerConfig(max_num_seqs=2).max_num_seqs_per_request == 1


def test_priority_policy_orders_waiting_by_priority_then_arrival() -> None:
    s = make(max_num_seqs=1, policy="priority")
    s.add_request(seq("late-low", "a", priority=5, arrival=1.0))
    s.add_request(seq("urgent", "b", priority=-1, arrival=3.0))
    s.add_request(seq("early-low", "c", priority=5, arrival=0.5))
    assert [r.request_id for r in s.waiting] == ["urgent", "early-low", "late-low"]
    assert s.schedule().scheduled[0].request.request_id == "urgent"


def test_fcfs_keeps_arrival_order_whatever_the_priority() -> None:
    s = make(max_num_seqs=1)
    s.add_request(seq("first", "a", priority=5))
    s.add_request(seq("second", "b", priority=-1))
    assert [r.request_id for r in s.waiting] == ["first", "second"]
