"""Session-wide test hygiene."""
import os

import pytest

from hearth.platform import process_affinity


@pytest.fixture(autouse=True)
def _unpin_main_thread():
    """An in-process LLMEngine pins the calling thread (pytest's) to one core, as an offline user wants; undo it
    after each test, or every later test, and every server subprocess (which inherits the mask), runs on one core."""
    yield
    if os.sched_getaffinity(0) != process_affinity():
        os.sched_setaffinity(0, process_affinity())


@pytest.fixture(autouse=True, scope="session")
def _panel_cache(tmp_path_factory: pytest.TempPathFactory):
    """Packed panel weights of the tests' throwaway checkpoints go to a session directory, not ~/.cache (server
    subprocesses inherit the variable)."""
    old = os.environ.get("HEARTH_PANEL_CACHE")
    os.environ["HEARTH_PANEL_CACHE"] = str(tmp_path_factory.mktemp("panels"))
    yield
    if old is None:
        os.environ.pop("HEARTH_PANEL_CACHE", None)
    else:
        os.environ["HEARTH_PANEL_CACHE"] = old


@pytest.fixture
def tokenizer_cache_dir(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """A fresh, empty tokenizer cache directory for this test (HEARTH_TOKENIZER_CACHE)."""
    root = tmp_path / "tokenizers"
    monkeypatch.setenv("HEARTH_TOKENIZER_CACHE", str(root))
    return root
