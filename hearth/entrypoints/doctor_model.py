"""`hearth doctor MODEL`: what a checkpoint will cost before it is loaded, per precision option."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from hearth.kv_sizing import AUTO_FRACTION, GiB, HEADROOM_BYTES
from hearth.loader import memory_fit

if TYPE_CHECKING:
    from hearth.loader.gguf import GGUFCheckpoint

CONTEXTS = (2048, 8192, 32768)


def model_rows(path: str) -> list[str]:
    """The report's lines: weights per option, KV bytes per token, what fits the available memory."""
    from hearth.loader.hf_folder import read_hf_config

    ckpt = None
    if os.path.isfile(path):
        from hearth.loader.gguf import load_gguf

        ckpt = load_gguf(path)
        cfg = ckpt.hf_config
    else:
        cfg = read_hf_config(path)
    fp = memory_fit.footprint(path, cfg)
    avail = memory_fit.available_bytes()
    head8 = False
    if fp.prequantized:
        options = [("as stored", fp.weight_bytes("stored"))]
        extra = 0 if ckpt is None else gguf_widened_bytes(ckpt)
        if extra > 0:  # (a GGUF's block types widened at load: the table below)
            options.append(("as loaded", fp.weight_bytes("stored") + extra))
    else:
        from hearth.loader.model_loader import int8_head

        head8 = int8_head("int8", cfg)  # (the same rule for int4 and nf4: hearth.loader.lm_head)
        options = [("float32", fp.weight_bytes("dense", 4)), ("bf16 / fp16", fp.weight_bytes("dense", 2)),
                   ("int8", fp.weight_bytes("int8", 2, head8)), ("int4 (group 128)", fp.weight_bytes("int4", 2, head8)),
                   ("nf4 (bitsandbytes)", fp.weight_bytes("nf4", 2, head8))]
    lines = [f"model {path}: {(cfg.get('architectures') or ['?'])[0]}, max_position_embeddings {fp.max_len}",
             f"KV cache per token: {fp.kv_per_token / 1024:.1f} KiB (bf16), {fp.kv_per_token_int8 / 1024:.1f} KiB "
             "(--kv-cache-dtype int8)",
             f"available memory {avail / GiB:.1f} GiB, of which {HEADROOM_BYTES / GiB:.0f} GiB is left for the "
             f"runtime; automatic KV sizing takes {AUTO_FRACTION:.0%} of the rest (--kv-cache-space sets it)", ""]
    head = f"{'weights':<18}{'GiB':>8}{'KV tokens (bf16)':>18}{'max context':>13}" + "".join(
        f"{f'seqs @ {c}':>14}" for c in CONTEXTS)
    lines.append(head)
    for name, nbytes in options:
        free = avail - HEADROOM_BYTES - nbytes
        if free <= 0:
            lines.append(f"{name:<18}{nbytes / GiB:>8.2f}  does not fit ({(nbytes + HEADROOM_BYTES) / GiB:.1f} GiB "
                         "needed)")
            continue
        tokens = free // fp.kv_per_token
        lines.append(f"{name:<18}{nbytes / GiB:>8.2f}{tokens:>18,}{min(tokens, fp.max_len):>13,}" + "".join(
            f"{tokens // c:>14,}" for c in CONTEXTS))
    if head8:
        lines.append("int8 / int4 / nf4: the LM head quantized at load to int8 per row"
                     + (", beside the tied embedding table" if fp.head_tied else "")
                     + " (HEARTH_QUANT_LM_HEAD=0 keeps it bf16)")
    if ckpt is not None:
        lines += [""] + gguf_type_rows(ckpt)
    return lines


def gguf_widened_bytes(ckpt: GGUFCheckpoint) -> int:
    """The bytes a GGUF's widened tensors take beyond their file bytes under --dtype auto."""
    from hearth.loader.gguf.widened import widened_types
    from hearth.loader.model_loader import resolve_model_dtype
    from hearth.weights.gguf import KEPT_NAMES

    rows = widened_types(ckpt, KEPT_NAMES, resolve_model_dtype("auto", ckpt.hf_config))
    return sum(r.extra_bytes for r in rows)


def gguf_type_rows(ckpt: GGUFCheckpoint) -> list[str]:
    """Each tensor type in the file: its tensors and bytes, and whether it stays quantized (its layout and the kernel
    a decode step of one row gets) or is widened at load (what it becomes and the memory that costs)."""
    from hearth.loader.gguf.reader import TYPES
    from hearth.loader.gguf.widened import widened_types
    from hearth.loader.model_loader import resolve_model_dtype
    from hearth.weights import dispatch, layouts
    from hearth.weights.gguf import KEPT_NAMES

    dtype = resolve_model_dtype("auto", ckpt.hf_config)
    widened = {r.name: r for r in widened_types(ckpt, KEPT_NAMES, dtype)}
    counts: dict[str, list[int]] = {}
    for _, info in ckpt.tensor_infos():
        row = counts.setdefault(TYPES[info.ggml_type][0], [0, 0])
        row[0] += 1
        row[1] += info.nbytes
    mib = 1 << 20
    lines = [f"{'tensor type':<12}{'tensors':>8}{'MiB':>10}  at load (--dtype auto: {str(dtype).removeprefix('torch.')})"]
    for name, (n, nbytes) in sorted(counts.items(), key=lambda kv: -kv[1][1]):
        what = "float, as stored"
        if name in KEPT_NAMES:
            lay = next(lay for lay in layouts.TABLE if name in lay.packs)
            what = f"kept quantized: {lay.name} layout, {dispatch.plan(lay, 1, dispatch.caps()).value} kernel at 1 row"
        if name in widened:  # (a kept type's tensors other than matrices and the embedding are widened too)
            w = widened[name]
            what = (f"{what}; {w.tensors} " if name in KEPT_NAMES else "") + (
                f"WIDENED to {str(w.dtype).removeprefix('torch.')}"
                + ("" if name in KEPT_NAMES else ", no kernel keeps it quantized")
                + f": {w.memory_bytes / mib:.1f} MiB in memory (+{w.extra_bytes / mib:.1f} MiB)")
        lines.append(f"{name:<12}{n:>8}{nbytes / mib:>10.1f}  {what}")
    return lines
