"""The C heap (glibc's malloc): the bytes it has handed out, and giving its freed pages back to the OS.

The grammar cache charges a compiled grammar what its compile added to the heap (llguidance allocates with the
system malloc); RSS is no measure of that, as glibc reuses pages freed by an evicted grammar. The model router gives
the heap back after a model's front state is dropped: glibc keeps freed pages in each thread's arena otherwise.
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
    """Return freed heap pages to the OS (glibc's malloc_trim, every arena). Memory freed in a thread's arena (a
    dropped grammar, an unloaded model's tokenizer) is otherwise kept there, and RSS would not come down."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)


def free_bytes() -> int:
    """Bytes malloc keeps free in its arenas for reuse (0 off glibc): what give_back could return."""
    fn = _mallinfo2()
    return fn().fordblks if fn is not None else 0
