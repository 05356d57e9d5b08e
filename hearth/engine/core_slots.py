"""Which cores each resident model of a multi-model server computes on.

Several models whose OpenMP threads are pinned to the same cores stall each other: each one's barriers wait for
threads the OS has descheduled to run the other's. So the cores are split into slots (dp_cores' split: NUMA
nodes, else the physical cores evenly), as many as models may be resident (--max-loaded-models, else the number
of models; at most one per core), and a model that loads takes a free slot; it gives the slot back when it
unloads. When every slot is taken (more resident models than cores) a loading model shares the slot with the
fewest models on it. --omp-threads-bind overrides: 'a|b|...' gives the slots' core lists, 'nobind' leaves threads
unpinned, one list puts every model on it; a model's own omp-threads-bind (its TOML entry) takes no slot.
"""
from __future__ import annotations

from hearth.distributed.dp_cores import dp_core_sets
from hearth.platform import cpu_info


def slot_count(num_models: int, max_loaded: int | None, dp: int) -> int:
    """As many slots as models may be resident, each with at least one core per data-parallel engine."""
    wanted = min(num_models, max_loaded) if max_loaded is not None else num_models
    return max(1, min(wanted, cpu_info().physical_cores // dp))


def core_slots(slots: int, dp: int, bind: str | None, threads: int | None) -> list[list[str]]:
    """Per slot, one --omp-threads-bind value per data-parallel engine. Raises ValueError naming the fix."""
    bind = (bind or "auto").strip()
    if bind == "nobind":
        return [["nobind"] * dp]
    if bind != "auto":
        lists = bind.split("|")
        if len(lists) == 1 and dp == 1:
            return [dp_core_sets(1, bind, threads)]  # one list: every model on it (they share it)
        if len(lists) % dp:
            raise ValueError(f"--omp-threads-bind {bind!r} gives {len(lists)} core lists: give one per engine "
                             f"(--data-parallel-size {dp}) of each model slot, '|'-separated (e.g. '0-3|4-7')")
        slots = len(lists) // dp
    else:
        slots = max(1, slots)
    sets = dp_core_sets(slots * dp, bind, threads)
    return [sets[i * dp:(i + 1) * dp] for i in range(slots)]


class CoreSlots:
    """The slots and which models hold them. Used on the event loop only (the router's)."""

    def __init__(self, slots: list[list[str]]) -> None:
        self.slots = slots
        self.holders: list[set[str]] = [set() for _ in slots]

    def take(self, name: str) -> list[str]:
        """The binds for `name`'s engines: a free slot (the lowest), else the least shared one."""
        self.release(name)
        i = min(range(len(self.slots)), key=lambda k: (len(self.holders[k]), k))
        self.holders[i].add(name)
        return self.slots[i]

    def release(self, name: str) -> None:
        for h in self.holders:
            h.discard(name)

    def slot_of(self, name: str) -> int | None:
        return next((i for i, h in enumerate(self.holders) if name in h), None)
