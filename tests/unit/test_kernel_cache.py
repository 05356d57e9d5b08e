"""The compiled-kernel cache is keyed by source content, not install path: a new venv or clone reuses it."""
from hearth.kernels import _build


def test_build_files_name_only_cache_paths():
    if _build.load() is None:
        import pytest

        pytest.skip("no C++ compiler here")
    build_dir = _build.cache_dir()
    assert (build_dir / _build.BUILT_MARKER).exists()
    ninja = (build_dir / "build.ninja").read_text()
    assert str(_build.CSRC) not in ninja  # sources are compiled from build_dir/src
    assert str(build_dir / "src") in ninja


def test_a_killed_builds_lock_file_does_not_block_the_next_build(tmp_path, monkeypatch):
    """torch's `lock` baton outlives a build killed midway (it would make every later start wait forever); the
    next build clears it under its own flock, and a build that finds the marker after waiting does nothing."""
    from torch.utils import cpp_extension

    calls = []

    def fake_load(**kwargs):
        calls.append((tmp_path / "lock").exists())

    monkeypatch.setattr(cpp_extension, "load", fake_load)
    (tmp_path / "lock").touch()  # left by a killed build
    _build._compile(tmp_path)
    assert calls == [False] and (tmp_path / _build.BUILT_MARKER).exists()
    assert sorted(p.name for p in (tmp_path / "src").iterdir()) == sorted(_build.SOURCES + _build.HEADERS)
    _build._compile(tmp_path)  # built meanwhile: no second build
    assert calls == [False]
