"""What this CPU can do, read once from /proc/cpuinfo and lscpu-level facts; thread setup and core binding.

HEARTH_KERNELS_ISA=avx2 narrows what this module reports, and everything else asks it (kernel dispatch, the C
kernels' own feature checks, --dtype auto, panels, torch's kernels through limit_torch_isa): the process then
behaves as on an AVX2-only CPU.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import os
import platform
import sys
from dataclasses import dataclass

from hearth import envs

logger = logging.getLogger("hearth")

# cpuinfo flag prefixes of what came after AVX2: AVX-512 and AVX10, AMX, and the VEX forms of later extensions
# (avx_vnni, avx_ifma, avx_ne_convert, ...). HEARTH_KERNELS_ISA=avx2 hides these flags.
_PAST_AVX2 = ("avx512", "avx10", "amx", "avx_")


@dataclass(frozen=True)
class CPUInfo:
    model_name: str
    flags: frozenset[str]
    physical_cores: int
    numa_nodes: int
    hidden: frozenset[str] = frozenset()  # flags the CPU has that HEARTH_KERNELS_ISA=avx2 hides from `flags`

    @property
    def has_avx2(self) -> bool:
        return "avx2" in self.flags and "fma" in self.flags

    @property
    def has_avx512(self) -> bool:
        return "avx512f" in self.flags and "avx512bw" in self.flags

    @property
    def has_avx512_bf16(self) -> bool:
        return "avx512_bf16" in self.flags

    @property
    def has_amx(self) -> bool:
        return "amx_bf16" in self.flags

    @property
    def has_vnni(self) -> bool:
        return "avx512_vnni" in self.flags or "avx_vnni" in self.flags

    @property
    def has_native_bf16(self) -> bool:
        return self.has_avx512_bf16 or self.has_amx

    @property
    def isa(self) -> str:
        """The best vector ISA hearth's kernels can use here."""
        if self.has_avx512:
            return "avx512" + ("_bf16" if self.has_avx512_bf16 else "")
        return "avx2" if self.has_avx2 else "generic"

    def summary(self) -> str:
        extras = [name for name, ok in [("avx512_bf16", self.has_avx512_bf16), ("amx", self.has_amx),
                                        ("vnni", self.has_vnni)] if ok]
        forced = " (HEARTH_KERNELS_ISA=avx2)" if self.hidden else ""
        return (f"{self.model_name}; {self.physical_cores} physical cores; isa={self.isa}{forced} "
                f"{' '.join(extras)}").strip()


@functools.cache
def cpu_info() -> CPUInfo:
    flags: set[str] = set()
    model = "unknown CPU"
    cores: set[tuple[str, str]] = set()
    physical_id = core_id = "0"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "flags" and not flags:
                    flags = set(value.split())
                elif key == "model name":
                    model = value
                elif key == "physical id":
                    physical_id = value
                elif key == "core id":
                    core_id = value
                    cores.add((physical_id, core_id))
    except OSError:
        pass
    usable = len(_PROCESS_AFFINITY)
    physical = min(len(cores) or usable, usable)
    numa = len([d for d in os.listdir("/sys/devices/system/node") if d.startswith("node")]) \
        if os.path.isdir("/sys/devices/system/node") else 1
    hidden = {f for f in flags if f.startswith(_PAST_AVX2)} if envs.kernels_isa() == "avx2" else set()
    return CPUInfo(model, frozenset(flags - hidden), max(1, physical), max(1, numa), frozenset(hidden))


# What torch's kernels read for their widest ISA: ATen's vectorized operators, and oneDNN (its GEMMs, bf16 included).
# Each reads its variable once, at its first use.
_TORCH_ISA_VARS = {"ATEN_CPU_CAPABILITY": ("avx2", ("default", "avx2")),
                   "ONEDNN_MAX_CPU_ISA": ("AVX2", ("SSE41", "AVX", "AVX2"))}


def limit_torch_isa() -> bool:
    """HEARTH_KERNELS_ISA=avx2: torch's own kernels on AVX2 too, through the variables above (a caller's value at
    or below AVX2 is kept). hearth's import runs this, before any torch operator: a process that ran torch
    operators before importing hearth keeps torch's wider kernels (a warning says so; setting both variables in
    the environment before starting avoids it). Returns whether the limit applies."""
    try:
        if envs.kernels_isa() != "avx2":
            return False
    except ValueError:  # (a bad value: the kernels' first read of it raises, naming the variable)
        return False
    for name, (value, narrow) in _TORCH_ISA_VARS.items():
        if os.environ.get(name, "").strip().upper() not in (v.upper() for v in narrow):
            os.environ[name] = value
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "backends") and torch.backends.cpu.get_cpu_capability() == "AVX512":
        logger.warning("HEARTH_KERNELS_ISA=avx2: torch ran %s kernels before hearth was imported and keeps them; "
                       "set ATEN_CPU_CAPABILITY=avx2 and ONEDNN_MAX_CPU_ISA=AVX2 before starting",
                       torch.backends.cpu.get_cpu_capability())
    return True


def parse_core_list(spec: str) -> list[int]:
    """'0-3,6' -> [0, 1, 2, 3, 6]. Raises ValueError naming the bad part."""
    cores: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = part.split("-")
                cores.extend(range(int(lo), int(hi) + 1))
            else:
                cores.append(int(part))
        except ValueError:
            raise ValueError(f"bad core list {spec!r}: use e.g. '0-3' or '0,2,4' (or 'auto' / 'nobind')") from None
    return cores


def bind_omp_threads(cores: list[int]) -> bool:
    """Pin OpenMP thread i of the calling thread's pool to cores[i].

    NOTE: libgomp keeps one worker pool per thread that opens parallel regions, so a thread that will run the
    model (e.g. the server's engine thread) must call this itself.

    Uses hearth's compiled hk_bind_threads (one C parallel region); where the kernels cannot load, one region
    through libgomp's GOMP_parallel with a Python callback (correct on the main thread; on other threads torch
    was seen to run later regions on a fresh, unpinned worker). Returns False when binding was not possible
    (never fatal).
    """
    import torch  # noqa: F401  (loads libgomp)

    from hearth import kernels

    lib = kernels.library()
    if lib is not None:
        arr = (ctypes.c_int32 * len(cores))(*cores)
        failed = lib.hk_bind_threads(arr, len(cores))
        if failed:
            logger.warning("core binding failed for %d of %d threads", failed, len(cores))
        return failed == 0
    return _bind_with_gomp_callback(cores)


def _libgomp() -> ctypes.CDLL | None:
    with open("/proc/self/maps") as f:
        for line in f:
            if "libgomp" in line or "libiomp" in line:
                return ctypes.CDLL(line.split()[-1])
    return None


def _bind_with_gomp_callback(cores: list[int]) -> bool:
    gomp = _libgomp()
    if gomp is None or not hasattr(gomp, "GOMP_parallel"):
        return False
    gomp.omp_get_thread_num.restype = ctypes.c_int
    errors: list[str] = []

    @ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    def pin(_: ctypes.c_void_p) -> None:
        i = gomp.omp_get_thread_num()
        try:
            os.sched_setaffinity(0, {cores[i % len(cores)]})
        except OSError as e:
            errors.append(str(e))

    gomp.GOMP_parallel(pin, None, ctypes.c_uint(len(cores)), ctypes.c_uint(0))
    if errors:
        logger.warning("core binding failed: %s", errors[0])
        return False
    return True


def release_calling_thread() -> None:
    """Undo binding for a thread that stops running the model (the server's main thread, once the engine thread
    has its own pool): it may run on every allowed core again, and its idle OpenMP workers exit, so they neither
    share the engine master's core nor count against libgomp's spin budget."""
    try:
        os.sched_setaffinity(0, _PROCESS_AFFINITY)
    except OSError as e:
        logger.debug("could not reset thread affinity: %s", e)
    gomp = _libgomp()
    if gomp is not None and hasattr(gomp, "omp_pause_resource_all"):
        gomp.omp_pause_resource_all(1)  # omp_pause_soft: free this thread's pool


# The cores this process may use, read before any binding narrows the calling thread's mask.
_PROCESS_AFFINITY = frozenset(os.sched_getaffinity(0))


def process_affinity() -> frozenset[int]:
    """The cores this process was started with, before any binding narrowed a thread's mask (data parallelism
    splits them)."""
    return _PROCESS_AFFINITY


_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # mallopt parameters (malloc.h)


def keep_freed_memory() -> bool:
    """Make glibc's malloc serve every size from its heap and keep what is freed, instead of mapping each block
    above its mmap threshold (at most 32 MiB) fresh and unmapping it when freed. Prefill activations are such blocks
    (a 2048-token Qwen2.5-0.5B MLP: tens of MB per layer), so every layer paid page faults to zero new pages, which
    are slow in VMs: with this, a long prefill takes about a tenth of the minor faults (peak RSS grows a little).
    The price: memory freed after a long prompt stays resident for the next one. Returns True if applied (glibc
    only; HEARTH_KEEP_FREED_MEMORY=0 turns it off)."""
    if not envs.keep_freed_memory() or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    # Trim only beyond 1 GiB of free heap top: trimming at glibc's default (128 KiB, or twice the dynamic mmap
    # threshold) would hand the pages back after every step and fault them in again on the next.
    return bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30))


# madvise(2) advice values (linux/mman.h; Python's mmap module lacks the newer ones before 3.12).
MADV_DONTNEED, MADV_HUGEPAGE, MADV_POPULATE_READ, MADV_COLLAPSE = 4, 14, 22, 25


@functools.cache
def _libc_madvise():
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int), ctypes.c_int
    return fn


def madvise(addr: int, nbytes: int, advice: int) -> bool:
    """madvise(2) on [addr, addr + nbytes) (page-aligned); whether it succeeded (False without libc's madvise, or
    an advice this kernel does not know: MADV_POPULATE_READ before Linux 5.14, MADV_COLLAPSE before 6.1)."""
    fn = _libc_madvise()
    return fn is not None and fn(addr, nbytes, advice) == 0


def setup_threads(threads: int | None, bind: str) -> tuple[int, list[int]]:
    """Set torch's thread count and bind OpenMP threads to cores. Returns (threads, bound cores or [])."""
    import torch

    info = cpu_info()
    allowed = sorted(_PROCESS_AFFINITY)
    if threads is None:
        threads = envs.omp_num_threads() or info.physical_cores  # --threads, else OMP_NUM_THREADS, else cores
    if threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    bind = (bind or "auto").strip()
    cores: list[int] = []
    if bind == "auto":
        cores = allowed[:threads]
    elif bind != "nobind":
        cores = parse_core_list(bind)
        missing = [c for c in cores if c not in allowed]
        if missing:
            raise ValueError(f"HEARTH_CPU_OMP_THREADS_BIND names cores {missing} this process may not use "
                             f"(allowed: {allowed})")
        threads = len(cores)
    torch.set_num_threads(threads)
    if cores and not bind_omp_threads(cores[:threads]):
        cores = []
    return threads, cores[:threads]
