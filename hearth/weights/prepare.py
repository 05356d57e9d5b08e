"""The post-load pass: each weight ends in the layout this machine's kernels read best, decided here only.

Per quantized layer, as its shards complete (so plain rows of every layer are never held at once):
    pack_parts(parts, scheme, k)  the source tensors (float, or GGUF blocks) -> a QWeight, through the table's packs
    relayout(qw)                  VNNI panels where dispatch.panels_take, else 4-row tiles (int4 group 32), else rows
Per LM head: head_weight(blocks) (a GGUF head), tied_head(qw) (the embedding's blocks as the head), float_head(w)
(a float head or tied table quantized at load to int8: --quantization int8 / int4 / bitsandbytes).
Per model, once loaded: prepare_model(model, source, dtype): activation rounding, huge pages, dense bf16 panels.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable

import torch
from torch import nn

from hearth import envs
from hearth.kernels import quant as qkernels
from hearth.weights import activations, dispatch, gguf, hugepages, panel_pack
from hearth.weights.formats.source import PackedSource
from hearth.weights.layouts import BY_NAME, TILES_Q6
from hearth.weights.packed import PANEL_COLS, QWeight, panel_scales, supports
from hearth.weights.reference import implied_mins
from hearth.weights.relayout import can_tile

logger = logging.getLogger("hearth")



def pack(source: str, layout: str, *args) -> QWeight:
    """The layout table's pack function from `source` into `layout` (layouts.TABLE[layout].packs[source])."""
    return BY_NAME[layout].packs[source](*args)


def can_panel(qw: QWeight) -> bool:
    """int8 or int4 in rows or tiles, groups of 32 or more, where the VNNI panel kernels run (dispatch.panels_take)."""
    return (not qw.panel_rows and qw.codebook is None and qw.shape[0] > 0 and dispatch.panels_take(qw.bits, qw.group, qw.shape[1]))


def relayout(qw: QWeight) -> QWeight:
    """qw in the layout its kernels read best here: VNNI panels (one kernel for every row count), else 4-row tiles
    for int4 group 32 (one address range per decode tile), else as it is. Exact either way (bytes moved)."""
    if can_panel(qw):
        return to_panels(qw)
    if envs.int4_tiles() and qkernels.available() and can_tile(qw):  # (HEARTH_INT4_TILES=0: plain rows)
        return pack("int4", "int4-tiles-min" if qw.mins is not None else "int4-tiles", qw)
    return qw


def pack_parts(parts: list, scheme: str, k: int, int4_group: int | None, final: bool = True) -> QWeight | None:
    """One layer's shards -> its QWeight (_pack_parts); then, past TRIM_FREE_BYTES of freed heap, that goes back
    to the OS: glibc keeps it (hearth's malloc settings, platform.keep_freed_memory) and the next layers'
    persistent bytes land between the holes, so a load would hold its temporaries' heap on top of its weights."""
    qw = _pack_parts(parts, scheme, k, int4_group, final)
    hugepages.trim_beyond(TRIM_FREE_BYTES)
    return qw


def _pack_parts(parts: list, scheme: str, k: int, int4_group: int | None, final: bool) -> QWeight | None:
    """One layer's shards (rows in order) -> its QWeight in its final layout; None: keep the layer dense.
    scheme "gguf": the parts are GGUFBlocks of one kept type (else None); "prequant": PackedSources of a
    pre-quantized checkpoint (or QWeights already repacked from them: a tensor-parallel slice), each through its
    format's pack (else None); "int8" / "int4*" / "nf4": float tensors. final=False: plain rows, not re-laid (a
    layer tensor parallelism cuts by columns next)."""
    done = relayout if final else _as_is
    if scheme == "prequant":
        if not all(isinstance(p, (PackedSource, QWeight)) for p in parts) or not supports(k, parts[0].group):
            return None
        return done(cat([pack(p.method, p.layout, p) if isinstance(p, PackedSource) else p for p in parts]))
    if scheme == "gguf":
        if not all(isinstance(p, gguf.GGUFBlocks) for p in parts):
            return None
        bits = gguf.panel_block_bits(parts)
        if final and bits and dispatch.panels_take(bits, 32, k):
            qw = gguf.panels_from_blocks(parts)  # straight from the file's blocks: no plain-row copy
            if qw is not None:
                return qw
        kinds = {p.kind for p in parts}
        if len(kinds) != 1 or not supports(k, 32):
            return None
        return done(cat([p.repack() for p in parts]))
    if scheme == "int8":
        if k % 32:
            return None
        return (final and pack_float_panels(parts, "int8", 8, k)) or done(pack_float_rows(parts, "int8"))
    if scheme == "nf4":  # (--quantization bitsandbytes)
        return pack_float_rows(parts, "nf4") if k % 64 == 0 else None
    if int4_group is None:
        return None
    return ((final and pack_float_panels(parts, "int4", 4, int4_group, int4_group))
            or done(pack_float_rows(parts, "int4", int4_group)))


# float32 bytes of one layer's rows quantized at a time (pack_float_rows)
FLOAT_CHUNK_BYTES = 16 << 20
# Freed heap a load may keep between layers (pack_parts): below it, the next layer reuses it without page faults.
TRIM_FREE_BYTES = 256 << 20


def pack_float_rows(parts: list, layout: str, *args, release: bool = True) -> QWeight:
    """Float shards (or GGUF blocks, dequantized) -> `layout`, FLOAT_CHUNK_BYTES of rows at a time: every float
    layout quantizes rows independently (per row, group or block within a row), so this is exact, and a layer's
    whole float32 copy and the quantizer's float temporaries of it never exist. Each shard's checkpoint pages go
    back once it is packed, else the mapping (kept alive by the embedding's and norms' views of it) holds every
    quantized layer's bf16 bytes resident beside its int8 / int4 (release=False: the caller hands them back)."""
    out: list[QWeight] = []
    for p in parts:
        if isinstance(p, gguf.GGUFBlocks):
            out.append(pack("float", layout, p.dequantize(), *args))
            continue
        step = max(1, FLOAT_CHUNK_BYTES // (4 * p.shape[1]))
        for r0 in range(0, p.shape[0], step):
            out.append(pack("float", layout, p[r0:r0 + step].float(), *args))
        if release:
            panel_pack.release_file_pages([p])
    return cat(out)


def pack_float_panels(parts: list, layout: str, bits: int, group: int, *args) -> QWeight | None:
    """Float shards quantized to `layout` (int8 / int4) straight into VNNI panels, FLOAT_CHUNK_BYTES of rows at a
    time: the same bytes as relayout(pack_float_rows(...)), without the layer's plain rows and their concatenated
    copy beside the panels (twice the layer's quantized bytes at the load's peak). None where panels do not run
    here (or a part is not a float tensor): the caller takes the rows path."""
    k = parts[0].shape[1] if parts else 0
    if not parts or not all(isinstance(p, torch.Tensor) for p in parts) or not dispatch.panels_take(bits, group, k):
        return None
    n = sum(p.shape[0] for p in parts)
    npan = -(-n // PANEL_COLS)
    data = torch.empty(npan, PANEL_COLS * k // (8 // bits), dtype=torch.uint8)
    scales = mins = None
    step = max(1, FLOAT_CHUNK_BYTES // (4 * k) // PANEL_COLS) * PANEL_COLS  # (whole panels per chunk)
    ends = list(itertools.accumulate(p.shape[0] for p in parts))
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        rows = [p[max(r0, e - p.shape[0]) - (e - p.shape[0]):min(r1, e) - (e - p.shape[0])]
                for p, e in zip(parts, ends) if e > r0 and e - p.shape[0] < r1]
        qw = pack("float", layout, (rows[0] if len(rows) == 1 else torch.cat(rows)).float(), *args)
        p0, p1 = r0 // PANEL_COLS, -(-r1 // PANEL_COLS)
        if not qkernels.pack_panels(qw.data, bits, r1 - r0, k, data[p0:p1]):
            return None
        if scales is None:
            width = PANEL_COLS * qw.scales.shape[1]
            scales = torch.empty(npan, width, dtype=qw.scales.dtype)
            mins = None if qw.mins is None else torch.empty(npan, width, dtype=qw.mins.dtype)
        scales[p0:p1] = panel_scales(qw.scales)
        if mins is not None:
            mins[p0:p1] = panel_scales(qw.mins)
        for p, e in zip(parts, ends):  # (each shard's checkpoint pages go back once its last row is packed)
            if r0 < e <= r1:
                panel_pack.release_file_pages([p])
    return QWeight(bits, qw.group, data, scales, mins, panel_rows=n)


def _as_is(qw: QWeight) -> QWeight:
    return qw


def input_perm(parts: list) -> torch.Tensor | None:
    """The column order of a pre-quantized layer's packed weight (GPTQ act-order), which x is gathered by; None:
    the checkpoint's order. One gather serves the whole layer, so its shards must share the order."""
    perms = [p.input_perm() if isinstance(p, PackedSource) else None for p in parts]
    if all(p is None for p in perms):
        return None
    if any(p is None or not torch.equal(p, perms[0]) for p in perms):
        raise ValueError("the shards of one merged layer (e.g. q/k/v) have different GPTQ act-order (g_idx) "
                         "permutations: hearth needs one per layer input")
    return perms[0]


def cat(parts: list[QWeight]) -> QWeight:
    """Shards of one layer (plain rows, one bits / group) as one QWeight."""
    if len(parts) == 1:
        return parts[0]
    if len({(p.bits, p.group) for p in parts}) != 1 or len({_codebook_key(p) for p in parts}) != 1:
        raise ValueError("shards of one layer quantized differently")
    if parts[0].codebook is not None:  # (absmax scales stay fp32: bitsandbytes' own)
        return QWeight(4, parts[0].group, torch.cat([p.data for p in parts]), torch.cat([p.scales for p in parts]),
                       None, codebook=parts[0].codebook)
    # fp16 scales (GGUF Q8_0/Q4_0/Q4_1) stay fp16 only when every shard has them; widening to fp32 is exact.
    dt = torch.float16 if all(p.scale_f16 for p in parts) else torch.float32
    mins = None  # symmetric int4 shards stay without mins; mixed with asymmetric ones, theirs are spelled out
    if any(p.mins is not None for p in parts):
        mins = torch.cat([implied_mins(p).to(dt) for p in parts]) if parts[0].bits == 4 else None
    return QWeight(parts[0].bits, parts[0].group, torch.cat([p.data for p in parts]),
                   torch.cat([p.scales.to(dt) for p in parts]), mins)


def _codebook_key(qw: QWeight) -> tuple[float, ...] | None:
    return None if qw.codebook is None else tuple(qw.codebook.tolist())


def embedding_blocks(blocks: gguf.GGUFBlocks) -> QWeight | None:
    """A GGUF embedding table kept in its repacked blocks where the kernels gather rows from them (None: dense)."""
    return blocks.repack() if qkernels.available() else None


def head_weight(head: gguf.GGUFBlocks) -> QWeight:
    """A GGUF LM head's kept blocks, repacked: a Q6_K head (llama-quantize's choice beside Q4_0 / Q4_K layers) as
    6-bit tiles where the kernels run (a third smaller than int8; exact either way), else panels or rows."""
    n, k = head.shape
    if head.type_name == "Q6_K" and envs.q6_tiles() and qkernels.available() and n % 4 == 0 and k % 256 == 0:
        return _pack_head_rows(head, TILES_Q6.packs["Q6_K"])
    return _pack_head_rows(head, gguf.GGUFBlocks.repack, panels=True)


# Rows of a GGUF LM head packed at a time (a multiple of 64: whole 4-row tiles and 64-row panels)
HEAD_STEP_ROWS = 4096


def float_head(w: torch.Tensor) -> QWeight | None:
    """A float LM head [vocab, hidden] (or a tied head's embedding table) quantized at load to int8 per row (the
    int8 layout's float pack), in panels where they run; None where the int8 layout cannot hold it (hidden not a
    multiple of 32). Stepped like a GGUF head: no float32 copy of the whole head exists, and the rows' checkpoint
    pages go back once packed."""
    n, k = w.shape
    if n == 0 or not supports(k, k):
        return None
    # (each step in FLOAT_CHUNK_BYTES of float32 rows at a time, as a quantized layer's)
    return _pack_head_rows(w, lambda rows: pack_float_rows([rows], "int8", release=False), panels=True,
                           step=FLOAT_HEAD_STEP_ROWS)


# Rows of a float LM head quantized per step (a multiple of 64): each step's float temporaries, plain int8 rows and
# panels are live at once on top of the head being filled, so fewer rows than a GGUF head's (no float copy) step.
FLOAT_HEAD_STEP_ROWS = 1024


def _pack_head_rows(head: gguf.GGUFBlocks | torch.Tensor, pack_rows: Callable, panels: bool = False,
                    step: int | None = None) -> QWeight:
    """pack_rows over `step` (None: HEAD_STEP_ROWS) of the head's rows at a time (GGUF blocks, or float rows), into
    one QWeight (exact: block rows, 4-row tiles, plain rows and per-row int8 are independent per row); each step's
    checkpoint pages go back once packed, so a head read from the file's mapping is never resident whole beside its
    packed copy. panels: each step goes on into VNNI panels where they run (a step is whole panels: they
    concatenate), so no plain-row copy of the whole head exists."""
    n, k = head.shape
    # The layers' freed heap goes back first: the head's one storage fits in none of its holes, so they would stay
    # resident beside it until the huge-page pass trims (the peak of a 7B GGUF load).
    hugepages.malloc_trim()
    out: list[torch.Tensor | None] = []
    qw, at = None, 0
    step = step or HEAD_STEP_ROWS
    maps = panel_pack.file_mappings()  # (read once: a big head is hundreds of steps)
    for r0 in range(0, n, step):
        if isinstance(head, gguf.GGUFBlocks):
            rows = head.data[r0:r0 + step]
            qw = pack_rows(gguf.GGUFBlocks(head.ggml_type, (rows.shape[0], k), rows))
        else:
            rows = head[r0:r0 + step]
            qw = pack_rows(rows)
        if panels and can_panel(qw):
            qw = to_panels(qw)
        parts = (qw.data, qw.scales, qw.mins)
        if not out:
            lead = -(-n // PANEL_COLS) if qw.panel_rows else n
            out = [None if t is None else torch.empty((lead, *t.shape[1:]), dtype=t.dtype) for t in parts]
        for o, t in zip(out, parts):
            if o is not None:
                o[at:at + t.shape[0]] = t
        at += parts[0].shape[0]
        panel_pack.release_file_pages([rows], maps)
    assert qw is not None and out  # (a head has rows)
    return dataclasses.replace(qw, data=out[0], scales=out[1], mins=out[2], panel_rows=n if qw.panel_rows else 0)


def tied_head(embed: QWeight) -> QWeight:
    """The embedding's blocks as a tied LM head: in panels where they run (the head's product dominates; lookups
    gather from the panels), else as they are."""
    return to_panels(embed) if can_panel(embed) else embed


def to_panels(qw: QWeight) -> QWeight:
    source = "int8" if qw.bits == 8 else "int4"
    return pack(source, f"{source}-panels", qw)


def prepare_model(model: nn.Module, source: str | None, dtype: torch.dtype, ranks: int = 1) -> None:
    """After every weight is in: the activation rounding per model (activations.set_model_activations), quantized
    weights into huge pages, dense bf16 projections into panels (mapped from the panel cache). Runs before anything
    caches raw weight pointers (the decode program is built later, by the model runner). ranks: the
    tensor-parallel ranks the model is split over."""
    act = activations.set_model_activations((q for q in hugepages.held(model) if isinstance(q, QWeight)),
                                            getattr(model, "lm_head_qweight", None), ranks)
    if act == "int8x2":
        logger.info("a small quantized model: activations in two int8 terms for every row (HEARTH_QUANT_ACT=auto)")
    elif act:
        logger.info("mostly 4-bit weights: activations rounded to %s for every row but the LM head's "
                    "(HEARTH_QUANT_ACT=auto)", act)
    if hugepages.enabled():
        hugepages.move_to_hugepages(model)
    panel_pack.pack_dense_weights(model, source, dtype)
    # The load's freed temporaries go back (huge pages off or stopped early, glibc would keep them for good).
    hugepages.malloc_trim()
