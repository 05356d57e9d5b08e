"""Session-wide test hygiene."""
import os

import pytest

from hearth.platform import _PROCESS_AFFINITY


@pytest.fixture(autouse=True)
def _unpin_main_thread():
    """An in-process LLMEngine pins the calling thread (pytest's) to one core, as an offline user wants; undo it
    after each test, or every later test, and every server subprocess (which inherits the mask), runs on one core."""
    yield
    if os.sched_getaffinity(0) != _PROCESS_AFFINITY:
        os.sched_setaffinity(0, _PROCESS_AFFINITY)


@pytest.fixture
def tokenizer_cache_dir(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """A fresh, empty tokenizer cache directory for this test (HEARTH_TOKENIZER_CACHE)."""
    root = tmp_path / "tokenizers"
    monkeypatch.setenv("HEARTH_TOKENIZER_CACHE", str(root))
    return root
