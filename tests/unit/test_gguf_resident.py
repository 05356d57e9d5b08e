"""Reading a GGUF's tensors one at a time keeps only the current tensor's file pages mapped into the process (the
page cache keeps the file): the mapping never holds the whole file beside the weights made from it."""
from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import torch

from hearth.loader.gguf import load_gguf
from tests.unit import test_gguf_loader as tiny_gguf
from tests.unit.test_panel_pack_memory import _resident


def test_tensors_release_file_pages_as_they_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # tensors of 1-2 MiB, so the kernel's fault-around (16 pages beside a fault) is small beside them
    for name, value in (("HIDDEN", 512), ("HEAD_DIM", 128), ("FFN", 1024)):
        monkeypatch.setattr(tiny_gguf, name, value)
    path = tmp_path / "m.gguf"
    tiny_gguf.write_llama(path, gguf.GGMLQuantizationType.F32)
    size, largest = path.stat().st_size, 512 * 1024 * 4
    resident = []
    for _, t in load_gguf(str(path)).tensors(torch.float32):
        resident.append(_resident(str(path)))  # (read while the generator holds the file mapped)
        assert t.numel()
    assert size > 8 * largest
    # without the release the last tensors saw the whole file resident; now at most about one tensor's pages
    assert max(resident) <= largest + (256 << 10), (size, resident)
