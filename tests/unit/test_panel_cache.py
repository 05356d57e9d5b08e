"""The panel cache's size cap: least recently used entries go first, dead packs' partial files go, live ones stay."""
from __future__ import annotations

import os

import pytest

from hearth.weights import panel_pack

MB = 1 << 20
CAP = 10 * MB


def _entry(root, name: str, size: int, mtime: int) -> str:
    path = os.path.join(root, name)
    with open(path, "wb") as f:
        f.truncate(size)
    os.utime(path, (mtime, mtime))
    return path


def test_make_room_evicts_least_recently_used_first(tmp_path) -> None:
    old = _entry(tmp_path, "aaa-1.bin", 4 * MB, 1_000)
    mid = _entry(tmp_path, "bbb-2.bin", 4 * MB, 2_000)
    new = _entry(tmp_path, "ccc-3.bin", 1 * MB, 3_000)
    assert panel_pack._make_room(str(tmp_path), 4 * MB, CAP)  # 9 + 4 > 10: the oldest goes, 5 + 4 fits
    assert not os.path.exists(old) and os.path.exists(mid) and os.path.exists(new)
    assert panel_pack._make_room(str(tmp_path), 9 * MB, CAP)  # 5 + 9 > 10: the older of the two goes, 1 + 9 fits
    assert os.listdir(tmp_path) == ["ccc-3.bin"]
    assert panel_pack._make_room(str(tmp_path), 10 * MB, CAP)
    assert os.listdir(tmp_path) == []
    assert not panel_pack._make_room(str(tmp_path), 11 * MB, CAP)  # over the cap alone: not cached at all


def test_make_room_removes_dead_partial_packs_and_counts_live_ones(tmp_path) -> None:
    dead_pid = 2**22 + 12345  # above Linux's pid_max: never a live process
    dead = _entry(tmp_path, f"aaa-1.bin.{dead_pid}.tmp", 8 * MB, 1_000)
    live = _entry(tmp_path, f"bbb-2.bin.{os.getpid()}.tmp", 6 * MB, 1_000)
    assert not panel_pack._make_room(str(tmp_path), 5 * MB, CAP)  # the live pack's 6 MiB still count
    assert not os.path.exists(dead) and os.path.exists(live)
    assert panel_pack._make_room(str(tmp_path), 4 * MB, CAP)


def test_a_mapped_entry_counts_as_recently_used(tmp_path) -> None:
    path = _entry(tmp_path, "aaa-1.bin", 1 * MB, 1_000)
    mapped = panel_pack._map(path, 1 * MB, create=False, cap=CAP)
    assert mapped is not None
    assert os.stat(path).st_mtime > 1_000


def test_cap_must_be_a_number(monkeypatch) -> None:
    """A bad cap is an error at load (the CLI prints it as one line), not a silent pack into memory."""
    from torch import nn

    from hearth.kernels import panels

    monkeypatch.setenv("HEARTH_PANEL_CACHE_MAX_GIB", "lots")
    if not panels.supported():
        pytest.skip("no panels on this CPU: the cap is never read")
    with pytest.raises(ValueError, match="HEARTH_PANEL_CACHE_MAX_GIB must be a number of GiB, got 'lots'"):
        panel_pack.pack_dense_weights(nn.Module())
