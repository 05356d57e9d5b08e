"""Which cores each data-parallel engine gets: one NUMA node each when there are several, else the physical
cores split evenly. HEARTH_CPU_OMP_THREADS_BIND / --omp-threads-bind may give one list per engine, '|'-separated
(vLLM's VLLM_CPU_OMP_THREADS_BIND form, e.g. '0-3|4-7')."""
from __future__ import annotations

import glob
import os

from hearth.platform import _PROCESS_AFFINITY, cpu_info, parse_core_list


def numa_core_lists() -> list[list[int]]:
    """The allowed cores of each NUMA node that has any ([] when sysfs does not say)."""
    nodes = []
    for path in sorted(glob.glob("/sys/devices/system/node/node[0-9]*/cpulist")):
        with open(path) as f:
            text = f.read().strip()
        cores = [c for c in parse_core_list(text) if c in _PROCESS_AFFINITY] if text else []
        if cores:
            nodes.append(cores)
    return nodes


def _split(cores: list[int], parts: int) -> list[list[int]]:
    size, extra = divmod(len(cores), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(cores[start:end])
        start = end
    return out


def dp_core_sets(size: int, bind: str | None, threads: int | None) -> list[str]:
    """One --omp-threads-bind value per engine ('nobind' passes through). Raises ValueError naming the fix."""
    bind = (bind or "auto").strip()
    if bind == "nobind":
        return ["nobind"] * size
    if bind != "auto":
        lists = bind.split("|")
        if len(lists) != size:
            raise ValueError(f"--omp-threads-bind {bind!r} gives {len(lists)} core lists for --data-parallel-size "
                             f"{size}: give one per engine, '|'-separated (e.g. '0-3|4-7')")
        for spec in lists:
            parse_core_list(spec)  # a bad list fails here, not in a worker
        return lists
    nodes = numa_core_lists()
    physical = cpu_info().physical_cores
    if len(nodes) > 1 and size % len(nodes) == 0:
        # NOTE: the first `physical / nodes` allowed cores of a node are taken as its physical cores (Linux numbers
        # SMT siblings after every core).
        per_node = max(1, physical // len(nodes))
        sets = [part for node in nodes for part in _split(node[:per_node], size // len(nodes))]
    else:
        sets = _split(sorted(_PROCESS_AFFINITY)[:physical], size)
    if any(not s for s in sets):
        raise ValueError(f"--data-parallel-size {size} needs at least {size} cores; this process may use "
                         f"{min(physical, len(_PROCESS_AFFINITY))}")
    if threads is not None:
        sets = [s[:threads] for s in sets]
    return [",".join(map(str, s)) for s in sets]


def cores_available() -> int:
    return len(os.sched_getaffinity(0))
