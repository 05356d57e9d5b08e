"""Which cores each engine process gets (data-parallel engines, tensor-parallel ranks): one NUMA node each when
there are several, else the physical cores split evenly. HEARTH_CPU_OMP_THREADS_BIND / --omp-threads-bind may give
one list per process, '|'-separated (vLLM's VLLM_CPU_OMP_THREADS_BIND form, e.g. '0-3|4-7')."""
from __future__ import annotations

import glob
import os
import re
from collections.abc import Collection
from dataclasses import dataclass

from hearth.platform import cpu_info, parse_core_list, process_affinity

NODE_ROOT = "/sys/devices/system/node"


def numa_core_lists(root: str = NODE_ROOT, allowed: Collection[int] | None = None) -> list[list[int]]:
    """The allowed cores (default: this process's) of each NUMA node that has any, in node order ([] when sysfs
    does not say)."""
    allowed = process_affinity() if allowed is None else allowed
    nodes = []
    paths = glob.glob(os.path.join(root, "node[0-9]*", "cpulist"))
    for path in sorted(paths, key=lambda p: int(re.findall(r"node(\d+)", p)[-1])):
        with open(path) as f:
            text = f.read().strip()
        cores = [c for c in parse_core_list(text) if c in allowed] if text else []
        if cores:
            nodes.append(cores)
    return nodes


@dataclass(frozen=True)
class Topology:
    """What placement reads of the machine (a test passes its own)."""

    nodes: list[list[int]]  # numa_core_lists()
    physical: int  # physical cores
    allowed: list[int]  # the cores this process may use, sorted


def topology() -> Topology:
    return Topology(numa_core_lists(), cpu_info().physical_cores, sorted(process_affinity()))


def _split(cores: list[int], parts: int) -> list[list[int]]:
    size, extra = divmod(len(cores), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(cores[start:end])
        start = end
    return out


def dp_core_sets(size: int, bind: str | None, threads: int | None, topo: Topology | None = None,
                 flag: str = "--data-parallel-size") -> list[str]:
    """One --omp-threads-bind value per engine ('nobind' passes through). Raises ValueError naming the fix."""
    bind = (bind or "auto").strip()
    if bind == "nobind":
        return ["nobind"] * size
    if bind != "auto":
        lists = bind.split("|")
        if len(lists) != size:
            raise ValueError(f"--omp-threads-bind {bind!r} gives {len(lists)} core lists for {flag} "
                             f"{size}: give one per engine, '|'-separated (e.g. '0-3|4-7')")
        for spec in lists:
            parse_core_list(spec)  # a bad list fails here, not in a worker
        return lists
    topo = topo or topology()
    nodes, physical = topo.nodes, topo.physical
    if len(nodes) > 1 and size % len(nodes) == 0:
        # NOTE: the first `physical / nodes` allowed cores of a node are taken as its physical cores (Linux numbers
        # SMT siblings after every core).
        per_node = max(1, physical // len(nodes))
        sets = [part for node in nodes for part in _split(node[:per_node], size // len(nodes))]
    else:
        sets = _split(topo.allowed[:physical], size)
    if any(not s for s in sets):
        raise ValueError(f"{flag} {size} needs at least {size} cores; this process may use "
                         f"{min(physical, len(topo.allowed))}")
    if threads is not None:
        sets = [s[:threads] for s in sets]
    return [",".join(map(str, s)) for s in sets]


def cores_available() -> int:
    return len(os.sched_getaffinity(0))
