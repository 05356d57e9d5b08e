"""Bytes in use by the C heap (glibc's mallinfo2), for charging a compiled grammar's memory to the cache.

llguidance allocates with the system malloc, so what a compile adds to the heap is what keeping its grammar costs.
RSS is no measure of that: glibc reuses pages freed by an evicted grammar, so a new one would seem free.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools

import psutil


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


@functools.cache
def _mallinfo2():  # None off glibc (or before 2.33): heap_bytes falls back to RSS
    fn = getattr(_libc(), "mallinfo2", None)
    if fn is None:
        return None
    fn.restype = _MallInfo2
    return fn


def heap_bytes() -> int:
    """Bytes malloc has handed out and not had back (all threads' arenas plus mmapped chunks)."""
    fn = _mallinfo2()
    if fn is None:
        return psutil.Process().memory_info().rss
    info = fn()
    return info.uordblks + info.hblkhd


def give_back() -> None:
    """Return freed heap pages to the OS (glibc's malloc_trim). A dropped grammar's memory is otherwise kept by the
    worker thread's arena that built it, and RSS would not come down."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)
