"""Core binding of the OpenMP team in a thread that is not the main thread (the server's engine thread)."""
import os
import threading

import pytest
import torch

from hearth import kernels
from hearth.weights import apply
from hearth.platform import process_affinity, bind_omp_threads, release_calling_thread


def _tasks() -> dict[int, tuple[frozenset[int], int]]:
    """tid -> (allowed cores, user+system ticks) of every thread of this process."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(tid)] = (frozenset(os.sched_getaffinity(int(tid))), int(fields[11]) + int(fields[12]))
        except (OSError, ProcessLookupError):
            pass
    return out


@pytest.mark.skipif(len(process_affinity()) < 2 or not kernels.available(), reason="needs 2 cores + kernels")
def test_team_of_a_non_main_thread_is_pinned_and_does_the_work():
    cores = sorted(process_affinity())[:2]
    seen: dict = {}
    # As the server does: the main thread loads the model with its own bound team first.
    main_mask = os.sched_getaffinity(0)
    bind_omp_threads(cores)
    (torch.randn(512, 512) @ torch.randn(512, 512)).sum()

    def run() -> None:
        torch.set_num_threads(2)
        seen["bound"] = bind_omp_threads(cores)
        seen["me"] = threading.get_native_id()
        seen["mask"] = frozenset(os.sched_getaffinity(0))
        before = _tasks()
        a = torch.randn(768, 768)
        w = torch.randn(4096, 768, dtype=torch.bfloat16)
        for _ in range(40):  # torch's parallel regions and hearth's kernel, ~1 s
            (a @ a).sum()
            torch.nn.functional.embedding(torch.arange(4096), a.repeat(8, 1))
            apply.dense_linear(a[:8], w)
        seen["before"], seen["after"] = before, _tasks()

    t = threading.Thread(target=run)
    t.start()
    t.join()
    os.sched_setaffinity(0, main_mask)
    assert seen["bound"] and seen["mask"] == {cores[0]}
    before, after = seen["before"], seen["after"]
    # Every other thread that worked during the loop is pinned to the second core: none inherited the master's mask.
    workers = [tid for tid, (mask, ticks) in after.items()
               if tid != seen["me"] and ticks - before.get(tid, (mask, 0))[1] >= 5]
    assert workers, "no OpenMP worker ran: the team is a single thread"
    for tid in workers:
        assert after[tid][0] == {cores[1]}, f"worker {tid} ran with mask {sorted(after[tid][0])}"


def test_release_calling_thread_restores_the_process_mask():
    allowed = process_affinity()
    seen: dict = {}

    def run() -> None:
        os.sched_setaffinity(0, {min(allowed)})
        release_calling_thread()
        seen["mask"] = os.sched_getaffinity(0)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen["mask"] == allowed
