"""glibc keeps large freed blocks for reuse once the engine asks it to (platform.keep_freed_memory)."""
import os
import platform
import subprocess
import sys

import pytest

_PROBE = """
import ctypes, resource
from hearth.platform import keep_freed_memory
applied = keep_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def faults_of_fresh_64mb():  # one large block freed and asked for again, as each prefill layer does
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    p = libc.malloc(64 << 20)
    ctypes.memset(p, 1, 64 << 20)
    libc.free(p)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults_of_fresh_64mb()
print(applied, faults_of_fresh_64mb())
"""


def _probe(env_value: str | None) -> tuple[bool, int]:
    env = dict(os.environ)
    env.pop("HEARTH_KEEP_FREED_MEMORY", None)
    if env_value is not None:
        env["HEARTH_KEEP_FREED_MEMORY"] = env_value
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    applied, faults = out.stdout.split()
    return applied == "True", int(faults)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc malloc tunables")
def test_second_large_block_reuses_pages_only_when_kept():
    pages = (64 << 20) // os.sysconf("SC_PAGE_SIZE")
    applied, faults = _probe(None)
    assert applied and faults < pages // 10, faults  # the freed 64 MiB came back from the heap, already mapped
    applied, faults = _probe("0")
    assert not applied and faults > pages // 2, faults  # glibc's default: a fresh mapping, every page faulted
