"""Quantized weights moved into the huge-page arena: same values and results, aliases kept, dense weights left."""
from __future__ import annotations

import torch
from torch import nn

from hearth.weights import apply
from hearth.weights import hugepages
from hearth.weights import packed
from hearth.weights import quantize


def _anon_huge_kib(addr: int) -> int:
    """AnonHugePages of the mapping holding addr (/proc/self/smaps), in KiB."""
    found = False
    for line in open("/proc/self/smaps"):
        if not found and "-" in line.split(" ", 1)[0]:
            lo, hi = (int(v, 16) for v in line.split(" ", 1)[0].split("-"))
            found = lo <= addr < hi
        elif found and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def _model() -> tuple[nn.Module, packed.QWeight]:
    torch.manual_seed(0)
    qw = quantize.quantize_int4(torch.randn(1024, 2048) * 0.02, 32)  # 1 MiB of nibbles + 256 KiB of scales (x2, mins)
    lin = nn.Module()
    lin.qweight = qw
    lin.weight = nn.Parameter(qw.data, requires_grad=False)  # a second tensor object on the same storage
    lin.register_buffer("scales", qw.scales, persistent=False)
    lin.dense = nn.Parameter(torch.randn(64, 64), requires_grad=False)
    root = nn.Module()
    root.layers = nn.ModuleList([lin])
    root.lm_head_qweight = qw  # the same QWeight held twice, as a tied head is
    return root, qw


def test_quantized_weights_move_with_their_aliases() -> None:
    root, qw = _model()
    lin = root.layers[0]
    x = torch.randn(1, 2048)
    want = apply.linear(x, qw)
    data, scales, dense = qw.data.clone(), qw.scales.clone(), lin.dense.clone()
    old_ptr, dense_ptr = qw.data.data_ptr(), lin.dense.data_ptr()
    moved = hugepages.move_to_hugepages(root, min_bytes=1)
    assert moved >= qw.nbytes()
    assert qw.data.data_ptr() != old_ptr and lin.dense.data_ptr() == dense_ptr  # dense weights stay
    assert torch.equal(qw.data, data) and torch.equal(qw.scales, scales) and torch.equal(lin.dense, dense)
    assert lin.weight.data_ptr() == qw.data.data_ptr() and lin.scales.data_ptr() == qw.scales.data_ptr()
    assert root.lm_head_qweight is qw
    assert all(t.data_ptr() % 64 == 0 for t in (qw.data, qw.scales, qw.mins))
    assert torch.equal(apply.linear(x, qw), want)
    if hugepages.enabled():  # THP "always" / "madvise": the 1 MiB of nibbles sit in a 2 MiB-aligned arena
        assert _anon_huge_kib(qw.data.data_ptr()) >= 2048


def test_small_storages_and_switch_off(monkeypatch) -> None:
    root, qw = _model()
    ptr = qw.data.data_ptr()
    assert hugepages.move_to_hugepages(root, min_bytes=64 << 20) == 0  # nothing that large
    assert qw.data.data_ptr() == ptr
    monkeypatch.setenv("HEARTH_HUGEPAGES", "0")
    assert not hugepages.enabled()


def test_copy_stops_at_its_time_budget(monkeypatch) -> None:
    """With the budget spent (as when every 2 MiB fault waits for compaction) the weights stay where they are."""
    root, qw = _model()
    x = torch.randn(1, 2048)
    want = apply.linear(x, qw)
    ptr = qw.data.data_ptr()
    monkeypatch.setattr(hugepages, "_BUDGET_S", -1.0)
    assert hugepages.move_to_hugepages(root, min_bytes=1) == 0
    assert qw.data.data_ptr() == ptr and torch.equal(apply.linear(x, qw), want)



def test_slow_copy_stops_after_its_probe(monkeypatch) -> None:
    """A copy running below _MIN_RATE once _PROBE_S has passed stops there, well inside the time budget."""
    root, qw = _model()
    ptr = qw.data.data_ptr()
    monkeypatch.setattr(hugepages, "_PROBE_S", -1.0)
    monkeypatch.setattr(hugepages, "_MIN_RATE", 1e18)
    assert hugepages._BUDGET_S >= 1.0 and hugepages.move_to_hugepages(root, min_bytes=1) == 0
    assert qw.data.data_ptr() == ptr


def test_big_storages_collapse_in_place(monkeypatch) -> None:
    """A storage of at least _IN_PLACE_BYTES is not copied (it would exist twice at the load's peak): its tensors
    keep their pointers and values, and where the kernel has MADV_COLLAPSE its whole 2 MiB pages become huge."""
    root, small = _model()
    torch.manual_seed(1)
    big = quantize.quantize_int8(torch.randn(2048, 4096) * 0.02)  # 8 MiB of int8
    lin = nn.Module()
    lin.qweight = big
    root.layers.append(lin)
    x = torch.randn(1, 4096)
    want, data = apply.linear(x, big), big.data.clone()
    ptr, small_ptr = big.data.data_ptr(), small.data.data_ptr()
    monkeypatch.setattr(hugepages, "_IN_PLACE_BYTES", 4 << 20)
    monkeypatch.setattr(hugepages, "_BUDGET_S", 60.0)
    monkeypatch.setattr(hugepages, "_MIN_RATE", 0.0)
    moved = hugepages.move_to_hugepages(root, min_bytes=1)
    assert big.data.data_ptr() == ptr and torch.equal(big.data, data) and torch.equal(apply.linear(x, big), want)
    assert small.data.data_ptr() != small_ptr  # (the small ones still go into the arena)
    interior = (ptr + (2 << 20) - 1) // (2 << 20) * (2 << 20)
    if hugepages.enabled() and moved >= small.nbytes() + (2 << 20):  # (something was collapsed)
        assert _anon_huge_kib(interior) >= 2048
