"""Weight formats, in one home: the packed type, the layout table, the kernel dispatch and the post-load pass.

    packed.py       QWeight (a quantized [N, K] weight as the kernels read it)
    layouts.py      TABLE: one row per layout (C format code, pack function per source format, torch reference,
                    kernel family, GEMM row rule); layouts.of(qw) names a weight's row
    dispatch.py     plan(layout, rows, caps) -> Kernel: the one place a kernel is chosen (layers, the decode program
                    and `hearth doctor` all ask it)
    apply.py        y = x W^T + b for every layout: plan, then call hearth.kernels
    activations.py  how x is rounded for the integer kernels (HEARTH_QUANT_ACT, prompt rows, per-model choice)
    prepare.py      the post-load pass: the layout each weight ends in, activations, huge pages, dense panels
    quantize.py, gguf.py, relayout.py   the pack functions (from float, from GGUF blocks, between layouts)
    reference.py    torch dequantization, the numbers every kernel must give

Layering: hearth.kernels (C calls on raw tensors and format codes) < hearth.weights < hearth.layers. Nothing here
imports layers, models or engine, and nothing in hearth.kernels imports this package.

Adding a weight format (say a GPTQ or AWQ checkpoint's int4):
  1. Write one pack function from the source tensors to a QWeight in an existing layout (for GPTQ: unpack the
     int32-packed nibbles into `packed.pack_u4`'s order, scales [N, K / group], mins = -zero * scale), beside the
     others (a new module such as weights/gptq.py, importing only packed.py).
  2. Add it to that layout's row in layouts.TABLE: `packs={"gptq": gptq.pack, ...}`. The loader calls it; every
     kernel, the re-layouts (tiles, panels), the decode program and the doctor pick the weight up from its row.
  A format no existing layout can hold exactly needs a new row with a new C format code (csrc/hk_api.h), its
  kernels' code path, its torch reference (reference.py) and its row rule (`kernel`, `gemm`, `gemm_from`).
"""
from hearth.weights.packed import QWeight

__all__ = ["QWeight"]
