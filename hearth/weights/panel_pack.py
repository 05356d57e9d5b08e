"""After loading: repack every dense bf16 projection into panels (hearth.kernels.panels), where that pays.

The panels of a model live in one file, packed at the first start and mapped at every later one (like the compiled
kernels): $XDG_CACHE_HOME/hearth/panels/<key>.bin, the key hashing the checkpoint files' names, sizes and mtimes,
the model's layout and the panel format. Why a file: a copy of the weights needs fresh memory, and in a VM whose
host backs guest pages lazily first-touched memory is slow (huge pages or not), so packing a 1B model's weights in
memory at every start would nearly double its start-up. A mapped file's pages are
page cache: a later start maps them (read-only, private) at no cost. HEARTH_PANEL_CACHE=0 (or an unwritable cache,
or too little disk) packs into anonymous memory instead. The cache is capped (HEARTH_PANEL_CACHE_MAX_GIB, default
32): a new entry evicts the least recently used ones beyond it, as each model would otherwise leave a second copy of
its weights on disk for good.

The row-major weights the panels replace are dropped: heap copies are freed (and trimmed), and the pages of a
safetensors file mapping that packing read are handed back (MADV_DONTNEED on a private file mapping only drops
this process's copy; a later read would fault the same bytes in from the file), so resident memory holds one copy.
A tied LM head's table is packed too (Qwen2.5-0.5B's is 28% of its weights); lookups gather rows from the panels.
Runs before anything caches raw weight pointers (the decode program is built later, by the model runner).
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import logging
import mmap
import os
import shutil
import time

import torch
from torch import nn

from hearth import envs, platform
from hearth.kernels import panels
from hearth.weights import hugepages

logger = logging.getLogger("hearth")

FORMAT = "hearth-panels-1"  # bump when the panel layout or what gets packed changes
_ALIGN = 32  # bf16 elements: 64 bytes
_PAGE = 4096
_DISK_MARGIN = 1 << 30  # leave this much free on the cache's disk
_PACK_STEP_BYTES = 64 << 20  # checkpoint bytes packed (and released) per step of a first pack


def _file_mappings() -> list[tuple[int, int]]:
    """[start, end) of this process's file-backed private mappings (/proc/self/maps)."""
    found = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 6 and fields[5].startswith("/") and fields[1][3] == "p":
                    lo, hi = (int(v, 16) for v in fields[0].split("-"))
                    found.append((lo, hi))
    except OSError:
        pass
    return found


def _madvise_each(tensors: list[torch.Tensor], advice: int, maps: list[tuple[int, int]]) -> int:
    """madvise the whole pages of each tensor that lies in one of maps; returns the bytes advised."""
    done = 0
    for t in tensors:
        lo = t.data_ptr()
        hi = lo + t.numel() * t.element_size()
        if not any(a <= lo and hi <= b for a, b in maps):
            continue
        start, end = -(-lo // _PAGE) * _PAGE, hi // _PAGE * _PAGE
        if end > start and platform.madvise(start, end - start, advice):
            done += end - start
    return done


def file_mappings() -> list[tuple[int, int]]:
    """This process's file-backed private mappings, for release_file_pages calls in a loop (each read of
    /proc/self/maps parses every mapping of the process)."""
    return _file_mappings()


def release_file_pages(tensors: list[torch.Tensor], maps: list[tuple[int, int]] | None = None) -> int:
    """Hand back this process's pages of the checkpoint file mappings the tensors lie in (never written: a later
    read faults the same bytes in from the file). maps: file_mappings(), read once by the caller (None: read here).
    Returns the bytes advised."""
    return _madvise_each(tensors, platform.MADV_DONTNEED, _file_mappings() if maps is None else maps)


def _pack_releasing(w: torch.Tensor, out: torch.Tensor, maps: list[tuple[int, int]]) -> int:
    """panels.pack(w, out) _PACK_STEP_BYTES of rows at a time: each step's pages of a checkpoint file mapping are
    mapped in with one call (packing threads faulting them in page by page took over twice as long) and handed back
    once packed, so the process never holds both copies of more than one step (a 7B bf16 folder fits in 24 GB).
    Returns the bytes handed back."""
    n, k = w.shape
    step = max(panels.ROWS, _PACK_STEP_BYTES // (w.element_size() * k) // panels.ROWS * panels.ROWS)
    released = 0
    for r0 in range(0, n, step):
        rows = w[r0:r0 + step]
        _madvise_each([rows], platform.MADV_POPULATE_READ, maps)
        panels.pack(rows, out[r0 * k:])  # (panel r0 / ROWS starts at element r0 * k: ROWS rows of k each)
        released += _madvise_each([rows], platform.MADV_DONTNEED, maps)
    return released


def _source_identity(path: str) -> list[str]:
    """Names, sizes and mtimes of the checkpoint's files (a file, or a folder's top-level files)."""
    path = os.path.realpath(path)
    files = [path] if os.path.isfile(path) else sorted(os.path.join(path, f) for f in os.listdir(path))
    out = []
    for f in files:
        if os.path.isfile(f):
            st = os.stat(f)
            out.append(f"{f}:{st.st_size}:{st.st_mtime_ns}")
    return out


def _cache_path(source: str, layout: list[str]) -> str | None:
    root = envs.panel_cache_dir()
    if root is None:
        return None
    h = hashlib.sha256()
    for line in [FORMAT, *_source_identity(source), *layout]:
        h.update(line.encode() + b"\n")
    # <checkpoint path>-<everything>: a new entry for a path replaces its old ones (see _map)
    where = hashlib.sha256(os.path.realpath(source).encode()).hexdigest()[:12]
    return os.path.join(root, f"{where}-{h.hexdigest()[:20]}.bin")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # (EPERM: it exists, as another user)
        return True
    return True


def _make_room(root: str, nbytes: int, cap: int) -> bool:
    """Evict the least recently used entries of the cache in root (oldest mtime first; a start that maps an entry
    touches it) until they and a new entry of nbytes fit in cap bytes; also removes the partial files of packs whose
    process died. False if nbytes alone is over the cap. (A running server that maps an evicted entry keeps it: the
    file lives on, unnamed, until unmapped.)"""
    if nbytes > cap:
        return False
    entries, total = [], 0
    for name in os.listdir(root):
        full = os.path.join(root, name)
        try:
            st = os.stat(full)
            if name.endswith(".tmp"):  # <entry>.<pid>.tmp: a pack under way, or one whose process died
                pid = name.rsplit(".", 2)[-2]
                if pid.isdigit() and not _pid_alive(int(pid)):
                    os.remove(full)
                    continue
                total += st.st_size
            elif name.endswith(".bin"):
                entries.append((st.st_mtime_ns, st.st_size, full))
                total += st.st_size
        except OSError:
            continue  # gone meanwhile (another process evicting), or not ours to remove
    for _, size, full in sorted(entries):
        if total + nbytes <= cap:
            break
        with contextlib.suppress(OSError):
            os.remove(full)
            total -= size
            logger.info("panel cache: evicted %s (%.2f GB, least recently used) to stay under %.1f GiB "
                        "(HEARTH_PANEL_CACHE_MAX_GIB)", full, size / 1e9, cap / (1 << 30))
    return total + nbytes <= cap


def _tmp_path(path: str) -> str:
    """Where this process packs the cache entry `path` until it is complete (_make_room parses the pid back)."""
    return f"{path}.{os.getpid()}.tmp"


def _map(path: str, nbytes: int, create: bool, cap: int) -> tuple[torch.Tensor, mmap.mmap] | None:
    """The cache file as a bf16 tensor (and its mapping): an existing one mapped private (read, never written), or
    a new one of nbytes mapped shared for packing (written under a temporary name, renamed once complete and
    flushed to disk; the cache kept within cap bytes). None on failure."""
    try:
        if not create:
            if os.path.getsize(path) != nbytes:
                return None
            with open(path, "rb") as f:
                mm = mmap.mmap(f.fileno(), nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            with contextlib.suppress(OSError):
                os.utime(path)  # recently used: the last to be evicted (_make_room)
        else:
            root = os.path.dirname(path)
            os.makedirs(root, exist_ok=True)
            for old in glob.glob(os.path.join(glob.escape(root), os.path.basename(path).split("-")[0] + "-*.bin")):
                os.remove(old)  # this checkpoint's entries for other file versions or layouts
            if not _make_room(root, nbytes, cap):
                logger.info("panel cache: %.2f GB of panels exceed HEARTH_PANEL_CACHE_MAX_GIB; packing into memory",
                            nbytes / 1e9)
                return None
            if shutil.disk_usage(root).free < nbytes + _DISK_MARGIN:
                logger.info("panel cache: too little disk in %s; packing into memory", root)
                return None
            tmp = _tmp_path(path)
            with open(tmp, "w+b") as f:
                f.truncate(nbytes)
                mm = mmap.mmap(f.fileno(), nbytes, flags=mmap.MAP_SHARED)
        return torch.frombuffer(mm, dtype=torch.bfloat16), mm  # (the tensor keeps mm alive)
    except (OSError, ValueError) as e:
        logger.info("panel cache %s unusable (%s); packing into memory", path, e)
        return None


def pack_dense_weights(model: nn.Module, source: str | None = None, compute_dtype: torch.dtype = torch.bfloat16) -> int:
    """Put the model's dense bf16 Linear weights in panels when panels.supported(): mapped from the cache file of
    `source` (the checkpoint path) if one exists, else packed (into a new cache file when possible). Returns the
    bytes of panels. compute_dtype: the model's activations' dtype (the dot layout takes bf16 ones only)."""
    if not panels.supported(compute_dtype):
        return 0
    cap = envs.panel_cache_max_bytes()  # (read first: a bad value stops every start, cache hit or not)
    t0 = time.perf_counter()
    # (layers that can hold panels say so: Linear.can_use_panels; a tied head's table is the embedding's)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    named = [(name, m) for name, m in model.named_modules()
             if m is not embed and callable(getattr(m, "can_use_panels", None)) and m.can_use_panels()]
    # the tied head's weight (not where the head has its own int8 copy: the table then serves lookups only)
    if (getattr(model, "tie_word_embeddings", False) and getattr(model, "lm_head_qweight", None) is None
            and embed is not None and embed.can_use_panels()):
        named.append(("model.embed_tokens", embed))
    if not named:
        return 0
    sizes = [[-(-panels.numel(*b.shape) // _ALIGN) * _ALIGN for b in m.row_blocks()] for _, m in named]
    total = sum(sum(s) for s in sizes)
    layout = [f"layout {panels.layout()}"] + [f"{name}:{[tuple(b.shape) for b in m.row_blocks()]}" for name, m in named]
    path = _cache_path(source, layout) if source is not None else None
    mapped, cached, tmp = None, False, None
    if path is not None and os.path.exists(path):
        mapped = _map(path, 2 * total, create=False, cap=cap)
        cached = mapped is not None
    if mapped is None and path is not None:
        mapped = _map(path, 2 * total, create=True, cap=cap)
        tmp = _tmp_path(path) if mapped is not None else None
    buf = mapped[0] if mapped is not None else None
    if buf is None:
        found = hugepages.arena(2 * total) if hugepages.enabled() else None
        buf = found[0].view(torch.bfloat16) if found is not None else torch.empty(total, dtype=torch.bfloat16)
    offset = 0

    def alloc(numel: int) -> torch.Tensor:
        nonlocal offset
        out = buf[offset:offset + numel]
        offset += -(-numel // _ALIGN) * _ALIGN
        return out

    if tmp is not None:
        logger.info("packing %.2f GB of bf16 weights into panels, once for this checkpoint: %s", 2 * total / 1e9, path)
    maps = _file_mappings()
    dropped = 0
    with torch.no_grad():
        for _, m in named:
            first = offset
            if not cached:  # packed here, a few rows at a time; use_panels then views the same slices of buf
                for b in m.row_blocks():
                    dropped += _pack_releasing(b, alloc(panels.numel(*b.shape)), maps)
                offset = first
            replaced = m.use_panels(alloc, pack=False)
            if cached:
                dropped += _madvise_each(replaced, platform.MADV_DONTNEED, maps)
            del replaced
    if tmp is not None:
        try:
            mapped[1].flush()  # on disk before the name says complete: a crash must not leave a cache of zeros
            os.replace(tmp, path)
        except OSError as e:  # (a full disk, say) this run keeps its mapped panels; the next start packs again
            logger.info("panel cache %s not kept (%s)", path, e)
            with contextlib.suppress(OSError):
                os.remove(tmp)
            tmp = None
    hugepages.malloc_trim()
    how = f"mapped from {path}" if cached else f"packed into {path}" if tmp is not None else "packed in memory"
    logger.info("dense weights in panels: %.2f GB %s in %.2f s (%.2f GB of checkpoint pages released)",
                2 * total / 1e9, how, time.perf_counter() - t0, dropped / 1e9)
    return 2 * total
