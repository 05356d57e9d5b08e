"""Where tensor-parallel ranks run (rank_threads, sharing dp_cores with --data-parallel-size): one NUMA node per rank
where there are several, the physical cores split evenly on one node, explicit lists as given. Fed a fake two-node
topology: this machine has one node."""
from __future__ import annotations

import pytest

from hearth.distributed.tensor_parallel import rank_threads
from hearth.distributed.dp_cores import Topology, numa_core_lists

# Two sockets of 4 cores with SMT siblings numbered after every core (Linux's order): node0 0-3,8-11, node1 4-7,12-15.
TWO_NODES = Topology([[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]], 8, list(range(16)))
ONE_NODE = Topology([list(range(8))], 8, list(range(8)))


def test_numa_nodes_read_from_sysfs_in_node_order(tmp_path) -> None:
    for node, cpus in (("node0", "0-3,8-11"), ("node1", "4-7,12-15"), ("node10", "16"), ("node2", "")):
        (tmp_path / node).mkdir()
        (tmp_path / node / "cpulist").write_text(cpus + "\n")
    assert numa_core_lists(str(tmp_path), allowed=range(16)) == TWO_NODES.nodes  # (16 not allowed, node2 empty)
    assert numa_core_lists(str(tmp_path), allowed=range(17))[-1] == [16]  # node10 after node1, not before node2


def test_one_rank_per_numa_node_by_default() -> None:
    assert [rank_threads(None, "auto", r, 2, TWO_NODES) for r in (0, 1)] == [(4, "0,1,2,3"), (4, "4,5,6,7")]
    # 4 ranks on 2 nodes: each node's physical cores split between its two ranks
    assert [rank_threads(None, "auto", r, 4, TWO_NODES)[1] for r in range(4)] == ["0,1", "2,3", "4,5", "6,7"]
    assert rank_threads(2, "auto", 1, 2, TWO_NODES) == (2, "4,5")  # --threads takes the node's first cores


def test_one_node_splits_the_physical_cores_and_explicit_lists_win() -> None:
    assert [rank_threads(None, "auto", r, 2, ONE_NODE) for r in (0, 1)] == [(4, "0,1,2,3"), (4, "4,5,6,7")]
    assert rank_threads(None, "0-1|6-7", 1, 2, TWO_NODES) == (2, "6,7")  # one list per rank, '|'-separated
    assert rank_threads(None, "0-3,4-7", 1, 2, TWO_NODES) == (4, "4,5,6,7")  # one list: split evenly
    assert rank_threads(None, "nobind", 1, 2, TWO_NODES) == (4, "nobind")
    assert rank_threads(6, "auto", 0, 2, TWO_NODES) == (6, "nobind")  # more threads than the node's cores
    with pytest.raises(ValueError, match="gives 3 core lists for --tensor-parallel-size 2"):
        rank_threads(None, "0|1|2", 0, 2, TWO_NODES)
