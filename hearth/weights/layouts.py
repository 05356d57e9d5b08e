"""The layout table: one row per way a weight is laid out in memory for the kernels.

A row says what the bytes are (`code`: the C kernels' format argument, csrc/hk_api.h), what writes them (`packs`:
a pack function per source format), how to read them back in torch (`dequantize`: the reference the kernels match)
and which kernels read them at which row counts (`kernel`, `gemm`, `gemm_from`: hearth.weights.dispatch.plan reads
these and nothing else). `of(qw)` names the row of a QWeight.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from hearth.kernels import panels as dense_panels
from hearth.weights import gguf, quantize, relayout, reference
from hearth.weights.formats import awq, bitsandbytes, compressed_tensors, gptq
from hearth.weights.packed import QWeight


@dataclass(frozen=True)
class Layout:
    name: str
    code: int  # quantized: QWeight format code (hk_weight's `format`, quantized); dense: its dense format
    quantized: bool
    doc: str
    # source format -> the function that writes this layout from it (a float tensor, GGUF blocks, another layout)
    packs: dict[str, Callable] = field(default_factory=dict)
    dequantize: Callable[[object], torch.Tensor] | None = None
    # few-row kernel family: "dot" (hk_linear's dot kernels by activation rounding), "panels" (VNNI panels
    # at every row count), "dense" (rows as loaded), "dense-panels" (bf16 panels),
    # "codebook" (NF4 / FP4); all run through hk_linear
    kernel: str = "dot"
    gemm: bool = False  # the fp32-x GEMM (hk_linear's "gemm" / "bcast" kernels) reads it
    gemm_from: int = 0  # rows from which that GEMM beats the dot kernels on AVX-512 without VNNI


def _dense(w: torch.Tensor) -> torch.Tensor:
    return w.float()


def _as_loaded(w: torch.Tensor) -> torch.Tensor:
    return w  # (Linear keeps the checkpoint tensor itself: a file mapping's pages, no copy)


def _panels_back(p: torch.Tensor) -> torch.Tensor:
    return dense_panels.gather_rows(p, torch.arange(p.shape[0] * dense_panels.ROWS)).float()


ROWS_INT8 = Layout("int8", 0, True, "int8 rows, one fp32/fp16 scale per group of >= 32 (or per row)",
                   {"float": quantize.quantize_int8, "Q8_0": gguf.repack, "panels": relayout.from_panels,
                    "gptq": gptq.pack, "compressed-tensors": compressed_tensors.pack,
                    "bitsandbytes": bitsandbytes.pack_int8},
                   reference.dequantize, "dot", gemm=True, gemm_from=4)
ROWS_INT8_G16 = Layout("int8-g16", 0, True, "int8 rows, a scale per 16 weights (GGUF Q6_K decoded to int8)",
                       {"Q6_K": gguf.repack, "q6-tiles": relayout.untile_rows4}, reference.dequantize, "dot")
ROWS_INT4 = Layout("int4", 1, True, "int4 rows, 32 weights per 16 bytes, scale (+ min) per group",
                   {"float": quantize.quantize_int4, "Q4_0": gguf.repack, "Q4_1": gguf.repack, "Q4_K": gguf.repack,
                    "tiles": relayout.untile_rows4, "panels": relayout.from_panels,
                    "gptq": gptq.pack, "awq": awq.pack, "compressed-tensors": compressed_tensors.pack},
                   reference.dequantize, "dot", gemm=True, gemm_from=8)
TILES_INT4 = Layout("int4-tiles", 2, True, "int4 group 32 in 4-row tiles, scales inline, symmetric (Q4_0)",
                    {"int4": relayout.tile_rows4}, reference.dequantize, "dot", gemm=True, gemm_from=8)
TILES_INT4_MIN = Layout("int4-tiles-min", 3, True, "int4 group 32 in 4-row tiles, scales and mins inline",
                        {"int4": relayout.tile_rows4}, reference.dequantize, "dot", gemm=True, gemm_from=8)
TILES_Q6 = Layout("q6-tiles", 4, True, "GGUF Q6_K super-blocks as stored, 4 rows interleaved (an LM head)",
                  {"Q6_K": gguf.repack_q6_tiles}, reference.dequantize, "dot")
PANELS_INT8 = Layout("int8-panels", 5, True, "int8 in 64-column VNNI panels (AVX512-VNNI)",
                     {"int8": relayout.to_panels, "Q8_0": gguf.panels_from_blocks}, reference.dequantize, "panels")
PANELS_INT4 = Layout("int4-panels", 6, True, "int4 in 64-column VNNI panels (AVX512-VNNI)",
                     {"int4": relayout.to_panels, "Q4_0": gguf.panels_from_blocks, "Q4_1": gguf.panels_from_blocks},
                     reference.dequantize, "panels")
CODEBOOK_4 = Layout("nf4", 7, True, "4-bit indices into a 16-value codebook (bitsandbytes NF4 / FP4, GGUF IQ4_NL / "
                    "IQ4_XS), fp32 absmax per block", {"bitsandbytes": bitsandbytes.pack_4bit,
                                                      "float": bitsandbytes.quantize_nf4,
                                                      "IQ4_NL": gguf.repack, "IQ4_XS": gguf.repack},
                    reference.dequantize, "codebook")
DENSE_F32 = Layout("f32", 0, False, "fp32 rows as loaded", {"f32": _as_loaded}, _dense, "dense")
DENSE_BF16 = Layout("bf16", 1, False, "bf16 rows as loaded", {"bf16": _as_loaded}, _dense, "dense")
DENSE_F16 = Layout("f16", 2, False, "fp16 rows as loaded", {"f16": _as_loaded}, _dense, "dense")
PANELS_BF16 = Layout("bf16-panels", 3, False, "bf16 in 32-row panels for fp32 FMAs (AVX-512 without native bf16)",
                     {"bf16": dense_panels.pack}, _panels_back, "dense-panels")
PANELS_BF16_DOT = Layout("bf16-dot-panels", 4, False, "bf16 pairs in 32-row panels for vdpbf16ps (AVX512-BF16)",
                         {"bf16": dense_panels.pack}, _panels_back, "dense-panels")

TABLE: tuple[Layout, ...] = (ROWS_INT8, ROWS_INT8_G16, ROWS_INT4, TILES_INT4, TILES_INT4_MIN, TILES_Q6, PANELS_INT8,
                             PANELS_INT4, CODEBOOK_4, DENSE_F32, DENSE_BF16, DENSE_F16, PANELS_BF16, PANELS_BF16_DOT)
BY_NAME = {lay.name: lay for lay in TABLE}
_DENSE_ROWS = {torch.float32: DENSE_F32, torch.bfloat16: DENSE_BF16, torch.float16: DENSE_F16}


def of(qw: QWeight) -> Layout:
    """The table row of a quantized weight."""
    if qw.codebook is not None:
        return CODEBOOK_4
    if qw.panel_rows:
        return PANELS_INT8 if qw.bits == 8 else PANELS_INT4
    if qw.bits == 6:
        return TILES_Q6
    if qw.tiled:
        return TILES_INT4_MIN if qw.mins is not None else TILES_INT4
    if qw.bits == 4:
        return ROWS_INT4
    return ROWS_INT8_G16 if qw.group == 16 else ROWS_INT8


def of_dense(dtype: torch.dtype) -> Layout | None:
    """The table row of a dense weight in rows of `dtype` (None: no kernel reads that dtype)."""
    return _DENSE_ROWS.get(dtype)
