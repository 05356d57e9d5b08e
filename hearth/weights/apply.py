"""y = x W^T + b for every layout: ask dispatch.plan which kernel, then call it (the layers' forward ends here).

    from hearth.weights import apply
    y = apply.linear(x, qw, bias)                 # a QWeight, x [..., K] f32 / bf16 / f16 -> [..., N] in x's dtype
    y = apply.dense_linear(x, w, bias)            # dense rows as loaded
    y = apply.dense_linear_parts(x, parts, bias)  # the row blocks of one weight, without concatenating them
    y = apply.dense_panels_linear(x, panels, rows, bias)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from hearth import envs, kernels
from hearth.kernels import nf4 as nf4_kernels
from hearth.kernels import panels as dense_panels
from hearth.kernels import quant as qkernels
from hearth.kernels import weight as kweight
from hearth.platform import cpu_info
from hearth.weights import activations
from hearth.kernels.decoder import QUANT_KIND, LinearSpec
from hearth.weights import dispatch
from hearth.weights.dispatch import Kernel, plan
from hearth.weights.layouts import PANELS_BF16, PANELS_BF16_DOT, of, of_dense
from hearth.weights.packed import QWeight, supports
from hearth.weights.reference import dequantize
from hearth.weights.relayout import gather_panels, plain

_DTYPE_CODE = kernels._DTYPE_CODE


def _bf16_prefill() -> bool:
    """Prefill of a bf16 model on a CPU with native bf16 GEMMs: dequantized tiles rounded to bf16 (<= 2^-9 relative,
    the rounding a bf16 model's activations carry anyway) and torch's bf16 GEMM, which runs at several times its fp32
    GEMM's rate there. HEARTH_BF16_DOT=0 keeps fp32."""
    return cpu_info().has_native_bf16 and envs.bf16_dot()


# fp32 elements per dequantized tile in the prefill path (16 MiB).
_TILE_ELEMS = 4 << 20


# ---------------------------------------------------------------- quantized

def linear(x: torch.Tensor, qw: QWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x deq(W)^T + b (x [..., K]); output in x's dtype, fp32 accumulate; the kernel dispatch.plan names."""
    k = x.shape[-1]
    m = x.numel() // k if k else 0
    b = None if bias is None else bias.float().contiguous()
    x2 = x.reshape(m, k)
    layout = of(qw)
    c = dispatch.caps()
    if x.dtype in _DTYPE_CODE:
        kernel = plan(layout, m, c, activations.in_prompt())
    else:
        kernel = Kernel.TILED if c.kernels and m > 0 else Kernel.REFERENCE
    if kernel is Kernel.PANELS:
        act = activations.of(qw)
        if act == "float":  # (only if it changed after the load: the prepare pass keeps float weights in rows)
            raise RuntimeError("quantized weights were re-laid into VNNI panels at load, which take int8 / int8x2 "
                               "activations: set HEARTH_QUANT_ACT=float (or HEARTH_QUANT_PANELS=0) before loading")
        split = activations.int8_from(m, qw.activations) if act == "int8x2" else 0
        y = run_panels(x2, qw, b, split, x2.dtype == torch.bfloat16)
    elif kernel is Kernel.DOT or kernel is Kernel.GEMM or kernel is Kernel.BCAST:
        y = run(x2, qw, b, call=None if kernel is Kernel.DOT else kernel.value)
    elif kernel is Kernel.CODEBOOK:
        y = run_codebook(x2, qw, b)
    elif kernel is Kernel.TILED:
        y = tiled(x2, qw, b)
    else:
        y = F.linear(x2.float(), dequantize(qw), b)
    return y.reshape(*x.shape[:-1], qw.shape[0]).to(x.dtype)


def descriptor(qw: QWeight) -> kweight.Weight:
    """qw's kernel descriptor (csrc/hk_api.h hk_weight), built on first use and kept on qw: a call passes its
    address, not the weight's tensors one by one."""
    d = qw.desc
    if d is None or not d.describes(qw.data, qw.scales, qw.mins, qw.codebook):
        n, k = qw.shape
        d = qw.desc = kweight.quantized(qw.data, of(qw).code, n, k, qw.scales, qw.mins, qw.group, qw.codebook)
    return d


def run(x: torch.Tensor, qw: QWeight, bias: torch.Tensor | None, isa_code: int | None = None,
        call: str | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """One row-layout kernel on x [M, K] -> fp32 [M, N] (into out, contiguous, if given); call "float", "int8",
    "int8x2", "gemm" or "bcast" (default: the weight's activation rounding, activations.of)."""
    m, k = x.shape
    if x.stride(1) != 1 or (m > 1 and x.stride(0) < k):
        x = x.contiguous()
    n = qw.shape[0]
    out = torch.empty(m, n, dtype=torch.float32) if out is None else out
    kernel = kweight.KERNELS[call or qw.activations or activations.rounding()]
    kweight.linear(x, descriptor(qw), bias, out, kernel=kernel, isa_code=isa_code or kernels.isa())
    return out


def run_panels(x: torch.Tensor, qw: QWeight, bias: torch.Tensor | None, split: int, bf16: bool) -> torch.Tensor:
    """x [M, K] on VNNI panels -> fp32 [M, N], or with bf16 the result rounded to bf16 in the kernel (the fp32
    result's .to(torch.bfloat16), without an fp32 output pass): rows [0, split) with int8x2 activations, the rest
    single-term int8 (activations.int8_from)."""
    x = x.contiguous()
    m, n = x.shape[0], qw.shape[0]
    f32 = torch.empty(m, n, dtype=torch.float32)  # the result, or (bf16) the sums of K blocks before the last
    out = torch.empty(m, n, dtype=torch.bfloat16) if bf16 else None
    desc = descriptor(qw)
    for r0, r1, kernel in ((0, split, kweight.KERNELS["int8x2"]), (split, m, kweight.KERNELS["int8"])):
        if r1 > r0:
            kweight.linear(x[r0:r1], desc, bias, f32[r0:r1], out[r0:r1] if bf16 else None, kernel,
                           isa_code=kernels.isa())
    return out if bf16 else f32


def run_codebook(x: torch.Tensor, qw: QWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] (fp32 / bf16; others are widened to fp32) . w^T (+ bias fp32) on a codebook weight -> fp32 [M, N]."""
    if x.dtype not in (torch.float32, torch.bfloat16):
        x = x.float()
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty(x.shape[0], qw.shape[0], dtype=torch.float32)
    kweight.linear(x, descriptor(qw), bias, out, isa_code=kernels.isa())
    return out


def tiled(x: torch.Tensor, qw: QWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """Prefill: dequantize row tiles (bounded memory) and use torch's GEMM on each: fp32, or for bf16 activations where
    bf16 GEMMs are native the tiles rounded to bf16 and torch's bf16 GEMM."""
    n, k = qw.shape
    bf16 = x.dtype == torch.bfloat16 and _bf16_prefill()
    xs = x if bf16 else x.float()
    out = torch.empty(x.shape[0], n, dtype=torch.float32)
    tile = max(16, _TILE_ELEMS // k)
    for n0 in range(0, n, tile):
        n1 = min(n, n0 + tile)
        if qw.codebook is not None:  # (straight into bf16: rounded as .to(torch.bfloat16) rounds)
            w = nf4_kernels.dequant_rows(qw.data, qw.scales, qw.group, qw.codebook, k, n0, n1,
                                         torch.bfloat16 if bf16 else torch.float32)
        else:
            w = dequantize_rows(qw, n0, n1)
        out[:, n0:n1] = torch.mm(xs, (w.to(torch.bfloat16) if bf16 else w).t())
    if bias is not None:
        out += bias
    return out


def dequantize_rows(qw: QWeight, start: int, end: int, isa_code: int | None = None) -> torch.Tensor:
    """Rows [start, end) of the dequantized weight, fp32, by the kernel library (the torch reference without it)."""
    if qw.codebook is not None and qkernels.available():
        return nf4_kernels.dequant_rows(qw.data, qw.scales, qw.group, qw.codebook, qw.shape[1], start, end)
    if not qkernels.available() or qw.panel_rows or qw.codebook is not None:
        return dequantize(plain(qw).rows(start, end - start))
    return qkernels.dequant_rows(qw.data, of(qw).code, qw.shape[1], qw.scales, qw.mins, qw.group, start, end,
                                 isa_code)


def dequantize_gather(qw: QWeight, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` (int64 [n]) of the dequantized weight, fp32 [n, K]: an embedding lookup. IndexError for an id
    outside the table, as F.embedding."""
    n_rows, k = qw.shape
    if qw.panel_rows:
        return gather_panels(qw, ids)
    if not qkernels.available() or qw.codebook is not None:
        return dequantize(plain(qw).index_rows(ids))
    ids = ids.to(torch.int64).contiguous()
    return qkernels.dequant_gather(qw.data, of(qw).code, n_rows, k, qw.scales, qw.mins, qw.group, ids)


def program_spec(qw: QWeight, bias: torch.Tensor | None) -> LinearSpec | None:
    """qw as the decode program reads it, with dispatch.plan's kernel per row count; None where the program's
    kernels do not take it (no kernels, an unsupported group, float activations on panels)."""
    n, k = qw.shape
    act = activations.of(qw)
    layout = of(qw)
    c = dispatch.caps()
    if (not c.kernels or not supports(k, qw.group) or (layout.kernel == "panels" and act == "float")
            or layout.kernel == "codebook"):  # (the program has no codebook kernel: such layers run layer by layer)
        return None
    return LinearSpec(QUANT_KIND[act], layout.code, [(qw.data, n)], n, k, qw.data.stride(0), bias, qw.scales,
                      qw.mins, qw.group, plan=dispatch.program_plan(layout, c), any_rows=layout.kernel == "panels")


# ---------------------------------------------------------------- dense

def _dense_descriptor(w: torch.Tensor) -> kweight.Weight | None:
    """Dense rows' descriptor, kept on the tensor (built on its first call); None for rows the kernel takes only
    as a contiguous copy."""
    n, k = w.shape
    if w.stride(1) != 1 or (n > 1 and w.stride(0) < k):
        return None
    d = getattr(w, "_hk_weight", None)
    if d is None or not d.describes(w):
        d = kweight.dense([w])
        w._hk_weight = d
    return d


def _parts_descriptor(parts: list[torch.Tensor], code: int | None = None,
                      rows: list[int] | None = None) -> kweight.Weight:
    """The descriptor of a weight in row blocks (or bf16 panels with `rows` each), kept on its first block."""
    d = getattr(parts[0], "_hk_parts", None)
    if d is None or len(parts) != len(d.tensors) or not d.describes(*parts):
        d = kweight.dense(parts, code, rows)
        parts[0]._hk_parts = d
    return d


def dense_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x w^T + b like F.linear (x [..., K], w [N, K] rows as loaded); output in x's dtype."""
    layout = of_dense(w.dtype)
    if layout is not None and x.dim() >= 1 and x.shape[-1] == w.shape[-1] and kernels.kernel_ok(x, w, bias):
        m = x.numel() // x.shape[-1]
        if plan(layout, m, dispatch.caps()) is Kernel.DENSE:
            return kernels.run_linear(x.reshape(m, x.shape[-1]), w, bias,
                                      desc=_dense_descriptor(w)).reshape(*x.shape[:-1], w.shape[0])
    return kernels.torch_linear(x, w, bias)


def dense_linear_parts(x: torch.Tensor, parts: list[torch.Tensor], bias: torch.Tensor | None = None) -> torch.Tensor:
    """dense_linear(x, cat(parts), bias) without the cat: parts [N_i, K] (same dtype, contiguous) are the row blocks of
    one weight, e.g. q/k/v as the checkpoint stores them. One kernel call for few tokens; for more, one fp32 GEMM on
    the parts widened into one scratch weight (16-bit parts whose GEMM would run in fp32 anyway); else per part."""
    m = x.numel() // x.shape[-1] if x.dim() >= 1 else 0
    n = sum(p.shape[0] for p in parts)
    uniform = (x.shape[-1] == parts[0].shape[1] and all(p.is_contiguous() and p.dtype == parts[0].dtype for p in parts)
               and (bias is None or bias.shape == (n,)))
    layout = of_dense(parts[0].dtype)
    kernel = plan(layout, m, dispatch.caps()) if layout is not None else Kernel.TORCH
    if (uniform and kernel is Kernel.TORCH and m > 0 and parts[0].dtype in kernels.LOSSLESS_16BIT
            and kernels.available() and (x.dtype != parts[0].dtype or kernels.emulated(parts[0].dtype))):
        # Prefill: every part widened into consecutive rows of one fp32 scratch weight, then one GEMM straight
        # into the merged output (no per-part outputs, no cat).
        b = bias.float() if bias is not None else None
        return F.linear(x.float(), kernels.widen_parts(parts), b).to(x.dtype)
    if (len(parts) == 1 or kernel is not Kernel.DENSE or len(parts) > 8 or not uniform
            or not kernels.kernel_ok(x, parts[0], None)):
        biases = [None] * len(parts) if bias is None else list(bias.split([p.shape[0] for p in parts]))
        return torch.cat([dense_linear(x, p, b) for p, b in zip(parts, biases)], dim=-1)
    return kernels.run_linear_parts(x, _parts_descriptor(parts), bias)


def dense_panels_layout():
    """The table row of this machine's bf16 panels (what kernels.panels.pack writes)."""
    return PANELS_BF16_DOT if dense_panels.dtype_code() == PANELS_BF16_DOT.code else PANELS_BF16


# Weight rows per tile unpacked from the panels for torch's bf16 GEMM (a multiple of the panels' 32; ~7 MiB at K 3584).
_AMX_TILE_ROWS = 1024


def _amx_rows_linear(x: torch.Tensor, panels: list[torch.Tensor], rows: list[int],
                     bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] bf16 . cat(weights)^T (+ bias) by torch's bf16 GEMM (oneDNN: AMX tiles), the weights unpacked from
    the dot-layout panels a tile of rows at a time (the tile stays in cache for the GEMM; never the whole weight)."""
    k = x.shape[1]
    y = torch.empty(x.shape[0], sum(rows), dtype=torch.bfloat16)
    col = 0
    for panel, n in zip(panels, rows):
        for r0 in range(0, n, _AMX_TILE_ROWS):
            r1 = min(n, r0 + _AMX_TILE_ROWS)
            b = None if bias is None else bias[col + r0:col + r1].to(torch.bfloat16)
            y[:, col + r0:col + r1] = F.linear(x, dense_panels.dot_rows(panel, n, k, r0, r1), b)
        col += n
    return y


def dense_panels_linear(x: torch.Tensor, panels: list[torch.Tensor], rows: list[int],
                        bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] . cat(weights)^T (+ bias), the weights as bf16 panels (part i: rows[i] outputs); x's dtype out."""
    k, n = panels[0].shape[1], sum(rows)
    m = x.numel() // k
    layout = dense_panels_layout()
    kernel = plan(layout, m, dispatch.caps())
    if kernel is Kernel.WIDEN:  # long prefill: one fp32 GEMM on the widened weights
        y = torch.mm(x.reshape(m, k).float(), dense_panels.widen(panels, rows))
        if bias is not None:
            y += bias.float()
        return y.to(x.dtype).reshape(*x.shape[:-1], n)
    if kernel is Kernel.AMX_ROWS and x.dtype == torch.bfloat16:
        return _amx_rows_linear(x.reshape(m, k), panels, rows, bias).reshape(*x.shape[:-1], n)
    return kernels.run_linear_parts(x, _parts_descriptor(panels, layout.code, rows), bias)
