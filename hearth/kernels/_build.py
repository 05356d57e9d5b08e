"""Compile (once) and load the C++ kernels; None when that is impossible here.

The library is built by torch.utils.cpp_extension (ninja, per-content cache directory) but includes no torch
headers, which alone take over a minute to compile: it exports a small C ABI that hearth.kernels calls through
ctypes with data pointers. Its OpenMP runtime is torch's own libgomp (same soname, already loaded by torch).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import sys
import time
from pathlib import Path

import torch

from hearth import envs
from hearth.kernels import _signatures
from hearth.platform import cpu_info

logger = logging.getLogger("hearth")

CSRC = Path(__file__).parent / "csrc"
# Every .cpp / .h in csrc/ is part of the one library: a new kernel is a new file (plus its signature in
# _signatures.py), never an edit of a list.
SOURCES = sorted(p.name for p in CSRC.glob("*.cpp"))
HEADERS = sorted(p.name for p in CSRC.glob("*.h"))
# No -march: every vector instruction lives under a per-ISA `#pragma GCC target` and is chosen at run time.
CFLAGS = ["-O3", "-fopenmp", "-Wno-unused-function"]
LDFLAGS = ["-fopenmp"]

# Set in-process after a load: seconds spent compiling (0.0 when the cache was warm).
build_seconds: float | None = None


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/hearth/kernels/<hash of sources, flags and torch version> (envs.cache_root): rebuilt only
    when one of those changes."""
    h = hashlib.sha256()
    for name in SOURCES + HEADERS:
        h.update(name.encode())
        h.update((CSRC / name).read_bytes())
    h.update(" ".join(CFLAGS + LDFLAGS).encode())
    h.update(torch.__version__.encode())
    return Path(envs.cache_root()) / "hearth" / "kernels" / h.hexdigest()[:16]


BUILT_MARKER = "built.ok"


def _compile(build_dir: Path) -> None:
    """Build from a copy of the sources inside build_dir, so the build files name only paths in the cache: the
    same sources installed at another path (a new venv, a fresh clone) reuse it instead of rebuilding.

    NOTE: torch serializes builds with a `lock` file that only the process that made it removes: a build killed
    midway (Ctrl-C on a first start) left it behind, and every later start waited for it forever. Builds here
    hold an flock instead (the kernel drops it when its process dies); under it no other build runs, so a `lock`
    file found then is stale and goes."""
    import fcntl
    import shutil

    from torch.utils import cpp_extension

    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / "build.flock", "w") as flock:
        fcntl.flock(flock, fcntl.LOCK_EX)
        if (build_dir / BUILT_MARKER).exists():  # another process built it while this one waited
            return
        (build_dir / "lock").unlink(missing_ok=True)
        src = build_dir / "src"
        src.mkdir(exist_ok=True)
        for name in SOURCES + HEADERS:
            shutil.copyfile(CSRC / name, src / name)
        cpp_extension.load(
            name="hearth_kernels",
            sources=[str(src / s) for s in SOURCES],
            extra_cflags=list(CFLAGS),  # (copies: load() appends to the lists it is given)
            extra_ldflags=list(LDFLAGS),
            extra_include_paths=[str(src)],
            build_directory=str(build_dir),
            is_python_module=False,
            verbose=False,
        )
        # NOTE: written last: a process that finds the marker loads the .so without running ninja at all.
        (build_dir / BUILT_MARKER).touch()


@functools.cache
def load() -> ctypes.CDLL | None:
    global build_seconds
    if not envs.kernels_enabled():
        logger.info("hearth kernels disabled by HEARTH_KERNELS=0; using torch F.linear")
        return None
    bf16_dot = envs.bf16_dot()  # read first: a bad value is an error naming the variable, not a silent fallback
    try:
        # torch looks for `ninja` on PATH; the pip-installed one sits beside this interpreter, which a venv
        # used without activation does not put on PATH.
        bindir = os.path.dirname(sys.executable)
        if bindir not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")

        build_dir = cache_dir()
        start = time.perf_counter()
        if not (build_dir / BUILT_MARKER).exists():
            _compile(build_dir)
        build_seconds = time.perf_counter() - start
        lib = ctypes.CDLL(str(build_dir / "hearth_kernels.so"))
        _signatures.declare(lib)
        # (before any kernel runs: the C feature checks then agree with cpu_info, which HEARTH_KERNELS_ISA narrows)
        lib.hk_limit_isa(int(not cpu_info().has_avx512))
        lib.hk_linear_set_bf16_dot(int(bf16_dot))
        lib.hk_attention_set_bf16_dot(int(bf16_dot))
        if build_seconds > 2.0:
            logger.info("compiled hearth kernels in %.1f s (cached in %s)", build_seconds, build_dir)
        return lib
    except Exception as e:  # no compiler, no ninja, compile error: never fatal
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        logger.warning("hearth kernels unavailable (%s: %s); using torch F.linear", type(e).__name__, first[:200])
        return None
