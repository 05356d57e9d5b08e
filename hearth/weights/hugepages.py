"""Move a loaded model's weights into one arena backed by transparent huge pages (2 MiB).

Why: a decode step streams every weight once. With 4 KiB pages that is a TLB miss every 4 KiB of each row stream
(a page walk per 4 KiB of weights, every step); with 2 MiB pages, 512 times fewer, and a decode step of int4
linears measurably faster (THP in "madvise" mode, as on Debian/Ubuntu defaults).

How: every storage of a quantized weight (hearth.weights.QWeight data / scales / mins, also ones in plain
attributes such as `lm_head_qweight`) of at least `min_bytes` is copied once into an anonymous private mmap advised
MADV_HUGEPAGE, and every tensor object the modules hold that viewed it (parameters, buffers, attributes) is
re-pointed in place (`Tensor.set_`), so aliases (a QuantLinear's `weight` Parameter and its `qweight.data`, a tied
head) stay aliases. One arena for all weights: each tensor only pays 64-byte alignment, not a 2 MiB page of padding.
Run before anything caches raw pointers (the decode program is built later, by the model runner). The copy stops
after _BUDGET_S seconds (the kernel compacting memory for every 2 MiB fault) and leaves the rest where it is.
A storage of at least _IN_PLACE_BYTES (a big model's LM head) is not copied: the kernel collapses its whole 2 MiB
pages where they are (MADV_COLLAPSE), so it never exists twice (its copy was the peak of a big GGUF load).
Off with HEARTH_HUGEPAGES=0; a no-op off Linux or when the kernel's THP mode is "never".
"""
from __future__ import annotations

import ctypes
import logging
import mmap
import time
from collections.abc import Iterator

import torch
from torch import nn

from hearth import envs, platform
from hearth.weights.packed import QWeight

logger = logging.getLogger("hearth")

_ALIGN = 64  # bytes; every kernel's loads are unaligned-safe, this keeps rows cache-line aligned
# Seconds of copying after which the remaining storages stay where they are. Where the kernel has free 2 MiB pages
# the copy is fast; with THP defrag "madvise" (Debian / Ubuntu's default) and fragmented memory each huge-page fault
# waits for compaction instead, twenty times slower, which alone would break the start-up budget. The gain is a
# few percent of decode speed: not worth a slow start.
_BUDGET_S = 1.0
# And after _PROBE_S, a copy running below _MIN_RATE bytes/s stops there: compaction is slow for every page then,
# and in a VM whose host backs guest memory lazily each fresh page costs much more (after a host reclaim the copy
# runs an order of magnitude below its rate where free 2 MiB pages exist).
_PROBE_S = 0.2
_MIN_RATE = 1e9
_HUGE = 2 << 20
# Bytes of old storages freed between two malloc_trim calls during the copy (glibc keeps freed heap otherwise,
# and the process would peak at twice its quantized weights).
_TRIM_STEP = 64 << 20
_THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"
# Storages this large collapse in place (the arena's one benefit over that, whole pages at their unaligned ends,
# is at most 4 MiB of each).
_IN_PLACE_BYTES = 64 << 20
# Bytes collapsed per madvise call: the budget is checked between them.
_COLLAPSE_STEP = 32 << 20


def enabled() -> bool:
    """HEARTH_HUGEPAGES (default on) and a Linux kernel whose THP mode is "always" or "madvise"."""
    if not envs.hugepages():
        return False
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        with open(_THP_MODE) as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def _values(value: object) -> Iterator[torch.Tensor | QWeight]:
    if isinstance(value, (torch.Tensor, QWeight)):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _values(v)


def held(model: nn.Module) -> Iterator[torch.Tensor | QWeight]:
    """Every tensor and QWeight the modules hold: parameters, buffers, attributes (also inside lists / tuples)."""
    for module in model.modules():
        yield from (p for p in module._parameters.values() if p is not None)
        yield from (b for b in module._buffers.values() if b is not None)
        for value in vars(module).values():
            yield from _values(value)


def move_to_hugepages(model: nn.Module, min_bytes: int = 64 << 10) -> int:
    """Copy the storages of the model's quantized weights (QWeight data / scales / mins) of >= min_bytes into one
    huge-page arena (see the module doc) and re-point every tensor viewing them, until _BUDGET_S of copying has
    passed. Returns the bytes moved (arena bytes up to the end of the last storage moved).
    Dense weights stay where they are: a safetensors checkpoint's are the file's own page-cache pages (zero-copy
    load), and copying a bf16 model's projections with the file's pages cold would take about half of the start-up
    budget."""
    t0 = time.perf_counter()
    values = list(held(model))
    storages: dict[int, torch.UntypedStorage] = {}
    for q in values:
        if isinstance(q, QWeight):
            for t in (q.data, q.scales, q.mins):
                if t is not None and t.device.type == "cpu" and t.untyped_storage().nbytes() >= min_bytes:
                    storages[t.untyped_storage().data_ptr()] = t.untyped_storage()
    by_storage: dict[int, list[torch.Tensor]] = {}
    seen: set[int] = set()
    tensors = (t for v in values for t in ((v,) if isinstance(v, torch.Tensor) else (v.data, v.scales, v.mins)))
    for t in tensors:
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        ptr = t.untyped_storage().data_ptr()
        if ptr in storages:
            by_storage.setdefault(ptr, []).append(t)
    if not storages:
        return 0
    offsets, total, in_place = {}, 0, {}
    for ptr, s in list(storages.items()):
        if s.nbytes() >= _IN_PLACE_BYTES:
            in_place[ptr] = storages.pop(ptr)
            continue
        offsets[ptr] = total
        total += (s.nbytes() + _ALIGN - 1) // _ALIGN * _ALIGN
    found = arena(max(total, 1))
    if found is None:  # a kernel built without THP: nothing to gain from the copy
        return 0
    arena_bytes, skip = found
    malloc_trim()  # (the load's freed temporaries go back before the copy adds the arena)
    storage = arena_bytes.untyped_storage()
    moved, freed, t_copy = 0, 0, time.perf_counter()
    collapsed, stopped = _collapse_all(list(in_place.values()), t_copy)
    if stopped:
        storages.clear()  # (the budget is spent: nothing is copied)
    del in_place
    with torch.no_grad():
        for ptr in list(storages):
            spent = time.perf_counter() - t_copy
            if spent > _BUDGET_S or (spent > _PROBE_S and moved + collapsed < _MIN_RATE * spent):  # (the arena's
                logger.info("huge pages: stopped after %.1f s at %.2f GB/s (2 MiB pages are slow to come by); "
                            "%.2f of %.2f GB of quantized weights stay in 4 KiB pages", spent,  # (untouched rest
                            (moved + collapsed) / spent / 1e9, (total - moved) / 1e9, total / 1e9)  # costs no memory)
                break
            s = storages.pop(ptr)  # (the dict must not keep the old storage alive once it is copied)
            start = skip + offsets[ptr]
            old = torch.empty(0, dtype=torch.uint8).set_(s, 0, (s.nbytes(),), (1,))
            arena_bytes[offsets[ptr]:offsets[ptr] + s.nbytes()].copy_(old)
            for t in by_storage.pop(ptr):
                esize = t.element_size()
                # byte offset of t inside its old storage, kept inside the new one
                t.set_(storage, (start + t.storage_offset() * esize) // esize, t.size(), t.stride())
            moved, freed = offsets[ptr] + s.nbytes(), freed + s.nbytes()
            del old, s  # (the last references to the old storage: freed here)
            if freed >= _TRIM_STEP:  # the copies' freed heap goes back as it grows, not after all weights doubled
                t_trim = time.perf_counter()
                malloc_trim()
                t_copy += time.perf_counter() - t_trim  # (the budget is for copying)
                freed = 0
    del storages, by_storage
    malloc_trim()
    logger.info("weights in huge pages: %.2f GB copied, %.2f GB collapsed in place, in %.2f s", moved / 1e9,
                collapsed / 1e9, time.perf_counter() - t0)
    return moved + collapsed


def _collapse_all(storages: list[torch.UntypedStorage], t_start: float) -> tuple[int, bool]:
    """Collapse each storage's whole 2 MiB pages in place, _COLLAPSE_STEP at a time: the bytes collapsed, and
    whether the copy's time budget (or its probe rate) ran out. A kernel without MADV_COLLAPSE (before Linux 6.1)
    collapses nothing and the storages stay in 4 KiB pages."""
    done = 0
    for s in storages:
        lo = (s.data_ptr() + _HUGE - 1) // _HUGE * _HUGE
        hi = (s.data_ptr() + s.nbytes()) // _HUGE * _HUGE
        if hi <= lo or not _madvise(lo, hi - lo, platform.MADV_HUGEPAGE):
            continue
        for at in range(lo, hi, _COLLAPSE_STEP):
            spent = time.perf_counter() - t_start
            if spent > _BUDGET_S or (spent > _PROBE_S and done < _MIN_RATE * spent):
                logger.info("huge pages: collapsing stopped after %.1f s (2 MiB pages are slow to come by)", spent)
                return done, True
            n = min(_COLLAPSE_STEP, hi - at)
            if not _madvise(at, n, platform.MADV_COLLAPSE):
                return done, False  # (unsupported before Linux 6.1, or no huge page free: the copies' probe tells)
            done += n
    return done, False


def _madvise(addr: int, nbytes: int, advice: int) -> bool:
    ok = platform.madvise(addr, nbytes, advice)
    if not ok:
        logger.debug("madvise(%d) failed: %s", advice, ctypes.get_errno())
    return ok


def arena(nbytes: int) -> tuple[torch.Tensor, int] | None:
    """nbytes of fresh anonymous memory advised MADV_HUGEPAGE, starting on a 2 MiB boundary, as a uint8 tensor
    (which keeps the mapping alive) and that start's byte offset inside the tensor's storage; None if the kernel
    refuses the advice. Faulting it in costs one fault per 2 MiB instead of per 4 KiB (slow in some VMs)."""
    # mmap only promises 4 KiB alignment: map whole huge pages plus one and skip to the first boundary, so the
    # last huge page lies inside the mapping too.
    size = (nbytes + _HUGE - 1) // _HUGE * _HUGE + _HUGE
    mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # (the default is shared: shmem)
    try:
        mm.madvise(mmap.MADV_HUGEPAGE)
    except OSError as e:
        logger.debug("madvise(MADV_HUGEPAGE) failed (%s): weights stay in 4 KiB pages", e)
        mm.close()
        return None
    skip = (-ctypes.addressof(ctypes.c_char.from_buffer(mm))) % _HUGE
    return torch.frombuffer(mm, dtype=torch.uint8)[skip:skip + nbytes], skip


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


def free_heap_bytes() -> int | None:
    """Bytes malloc holds freed in its heaps (glibc's mallinfo2 fordblks, every arena); None off glibc >= 2.33."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return int(fn().fordblks)


def trim_beyond(nbytes: int) -> bool:
    """malloc_trim once more than nbytes were freed into the heap since the last trim (where that cannot be told:
    always). Returns whether it trimmed. Trimming every time would fault the next user's pages in again for nothing.
    (mallinfo2 still counts trimmed chunks as free, so the growth since the last trim is what says new frees.)"""
    global _free_after_trim
    free = free_heap_bytes()
    if free is not None and free - _free_after_trim <= nbytes:
        _free_after_trim = min(_free_after_trim, free)  # (freed chunks reused since: count from the lower mark)
        return False
    malloc_trim()
    _free_after_trim = free_heap_bytes() or 0
    return True


_free_after_trim = 0


def malloc_trim() -> None:
    """Give the freed weight copies' heap pages back to the OS (glibc keeps freed brk memory otherwise)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
