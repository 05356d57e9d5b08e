"""Decode program: a decoder stack's layers run in one C call per decode step (csrc/decoder.cpp).

    specs = [layer.program_spec() for layer in layers]   # None from any layer: no program
    program = decoder.DecodeProgram.build(specs)
    x, residual = program.run(x, positions, meta, int8_from)   # decode steps only (see `takes`)
    h = program.run(x, positions, meta, int8_from, final_norm=norm_spec)  # then the model's final RMSNorm

The C loop calls the same kernels, with the same rounding points, as the layers' Python forward, so results are
identical; it removes the per-layer Python of a step (module calls, allocations, ctypes argument packing). Layers
describe themselves (LayerSpec: pre-norm or sandwich norms, fused-qkv attention with optional per-head q/k RMSNorm,
bias, sliding window and logit softcap, NeoX rotary, a gated MLP, float or quantized projections, a KV cache in the
model dtype); a layer that cannot be described returns None and the stack keeps the layer-by-layer path. This module
never looks at layer classes. HEARTH_DECODE_PROGRAM=0 turns it off.
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from hearth import envs, kernels
from hearth.kernels import _build, fused, weight

_DTYPE = kernels._DTYPE_CODE  # (the C dtype codes every kernel takes)
QUANT_KIND = {"float": 1, "int8": 2, "int8x2": 3}  # LinearSpec.kind of quantized weights, by activation rounding
# A projection's kernel per row count, by hearth.weights.dispatch.Kernel's names (csrc/hk_api.h PlanKernel); the
# descriptor holds it for 1 .. PLAN_ROWS rows (kPlanRows), more rows take the last entry.
PLAN_KERNELS = {"dot": 1, "gemm": 2, "bcast": 3, "panels": 4, "dense": 5, "dense-panels": 6}
PLAN_ROWS = 64

i64, i32, f32, ptr = ctypes.c_int64, ctypes.c_int32, ctypes.c_float, ctypes.c_void_p


class _Linear(ctypes.Structure):
    # csrc/decoder.cpp HkLinearDesc: the weight's descriptor (the hk_weight every linear reads), the activation
    # rounding of a quantized weight (LinearSpec.kind), the bias and the kernel per row count.
    _fields_ = [("w", weight.HkWeight), ("kind", i32), ("pad", i32), ("bias", ptr),
                ("kernel_at", ctypes.c_int8 * (PLAN_ROWS + 1))]


class _Layer(ctypes.Structure):
    _fields_ = [("qkv", _Linear), ("o", _Linear), ("gate_up", _Linear), ("down", _Linear), ("norm1", ptr),
                ("norm2", ptr), ("norm_offset", f32), ("eps", f32), ("num_heads", i64), ("num_kv_heads", i64),
                ("head_dim", i64), ("rot_dim", i64), ("cos", ptr), ("sin", ptr), ("k_cache", ptr), ("v_cache", ptr),
                ("kv_dtype", i32), ("act", i32), ("attn_isa", i32), ("pad", i32), ("num_slots", i64),
                ("block_size", i64), ("window", i64), ("scale", f32), ("qk_offset", f32), ("q_norm", ptr),
                ("k_norm", ptr), ("qk_eps", f32), ("post_norm1", ptr), ("post_norm2", ptr), ("softcap", f32)]


class _Step(ctypes.Structure):
    _fields_ = [("T", i64), ("positions", ptr), ("slots", ptr), ("block_tables", ptr), ("bt_stride", i64),
                ("query_start", ptr), ("context_lens", ptr), ("num_seqs", i64), ("int8_from", i64)]


@functools.cache
def _lib() -> ctypes.CDLL | None:
    if not envs.decode_program() or kernels.isa() is None or not kernels.available() or fused._lib() is None:
        return None
    return _build.load()


@dataclass
class LinearSpec:
    """One projection as the program reads it. kind 0: dense (w_dtype a dtype or panel code; `parts` the row blocks,
    rows each); kind QUANT_KIND[rounding]: a quantized weight (w_dtype its format code, scales / mins / group).
    plan: the kernel (a PLAN_KERNELS name) for a step of 1 .. PLAN_ROWS rows, hearth.weights.dispatch.program_plan's."""

    kind: int
    w_dtype: int
    parts: list[tuple[torch.Tensor, int]]  # (weight tensor, its rows); quantized: one
    n: int
    k: int
    ldw: int
    bias: torch.Tensor | None = None  # fp32, contiguous
    scales: torch.Tensor | None = None
    mins: torch.Tensor | None = None
    group: int = 0
    plan: list[str] | None = None
    any_rows: bool = False  # the same kernel as the layer path at every row count (prompt steps too)


@dataclass
class NormSpec:
    weight: torch.Tensor  # fp32
    offset: float
    eps: float


@dataclass
class AttentionSpec:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    window: int
    softcap: float
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    isa: int


@dataclass
class RopeSpec:
    rot_dim: int
    cos: torch.Tensor  # fp32, contiguous
    sin: torch.Tensor


@dataclass
class LayerSpec:
    """A decoder layer: x -> x + [post1](attn(norm1(x))) -> x + [post2](mlp(norm2(x))) (post norms: Gemma 2/3)."""

    qkv: LinearSpec
    o: LinearSpec
    gate_up: LinearSpec
    down: LinearSpec
    norm1: NormSpec
    norm2: NormSpec
    attn: AttentionSpec
    rope: RopeSpec
    act: int  # 0 silu, 1 gelu-tanh (the gated MLP's activation)
    q_norm: NormSpec | None = None  # per-head q / k RMSNorm (Qwen3, Gemma 3)
    k_norm: NormSpec | None = None
    post1: NormSpec | None = None
    post2: NormSpec | None = None


def _linear(spec: LinearSpec, keep: list, max_rows: int) -> _Linear | None:
    """The descriptor, or None where the planned kernel for some step the program takes is not one it runs."""
    if len(spec.parts) > weight.MAX_PARTS or not spec.parts or spec.plan is None or len(spec.plan) != PLAN_ROWS:
        return None
    rows = PLAN_ROWS if spec.any_rows else min(max_rows, PLAN_ROWS)
    if any(k not in PLAN_KERNELS for k in spec.plan[:rows]):
        return None
    tensors = [t for t, _ in spec.parts]
    if spec.kind == 0:
        w = weight.dense(tensors, spec.w_dtype, [n for _, n in spec.parts], spec.ldw)
    else:
        w = weight.quantized(tensors[0], spec.w_dtype, spec.n, spec.k, spec.scales, spec.mins, spec.group)
    if w.n != spec.n or w.k != spec.k:
        return None
    keep += tensors + [spec.bias, spec.scales, spec.mins]
    desc = _Linear(w.desc, spec.kind, 0, spec.bias.data_ptr() if spec.bias is not None else None)
    for m, k in enumerate(spec.plan[:rows], start=1):
        desc.kernel_at[m] = PLAN_KERNELS[k]
    return desc


def _layer(spec: LayerSpec, keep: list, max_rows: int) -> _Layer | None:
    norms = (spec.norm1, spec.norm2) + ((spec.post1, spec.post2) if spec.post1 is not None else ())
    if any(n.offset != spec.norm1.offset or n.eps != spec.norm1.eps for n in norms):
        return None
    qk = (spec.q_norm, spec.k_norm) if spec.q_norm is not None else None
    if qk is not None and (qk[0].offset != qk[1].offset or qk[0].eps != qk[1].eps):
        return None
    a, rope = spec.attn, spec.rope
    if a.k_cache.dtype not in _DTYPE:
        return None
    lins = [_linear(s, keep, max_rows) for s in (spec.qkv, spec.o, spec.gate_up, spec.down)]
    if any(d is None for d in lins):
        return None
    keep += [a.k_cache, a.v_cache, rope.cos, rope.sin] + [n.weight for n in norms + (qk or ())]
    num_blocks, block_size = a.k_cache.shape[:2]
    return _Layer(*lins, spec.norm1.weight.data_ptr(), spec.norm2.weight.data_ptr(), spec.norm1.offset,
                  spec.norm1.eps, a.num_heads, a.num_kv_heads, a.head_dim, rope.rot_dim, rope.cos.data_ptr(),
                  rope.sin.data_ptr(), a.k_cache.data_ptr(), a.v_cache.data_ptr(), _DTYPE[a.k_cache.dtype], spec.act,
                  a.isa, 0, num_blocks * block_size, block_size, a.window, a.scale, qk[0].offset if qk else 0.0,
                  qk[0].weight.data_ptr() if qk else None, qk[1].weight.data_ptr() if qk else None,
                  qk[0].eps if qk else 0.0, spec.post1.weight.data_ptr() if spec.post1 is not None else None,
                  spec.post2.weight.data_ptr() if spec.post2 is not None else None, a.softcap)


class DecodeProgram:
    def __init__(self, layers: ctypes.Array, keep: list, hidden: int, dtype: torch.dtype, takes_prompts: bool,
                 max_rows: int) -> None:
        self.layers, self.hidden, self.dtype = layers, hidden, dtype
        self._keep = keep  # every tensor the descriptions point at: none may be freed while the program lives
        # Prompt steps too when every projection runs the layer path's kernel at any row count (LinearSpec.any_rows:
        # bf16 pair panels in a bf16 model, quantized VNNI panels), so only the per-layer Python goes. Other weights
        # keep prompts on the layer path (torch's GEMM for long prompts, quantized prompt tiles).
        self.takes_prompts = takes_prompts
        # Steps of more rows go to the layer path even with takes_prompts (dispatch.program_prompt_rows: where a
        # layer's long-prompt kernel is one the program does not have, torch's bf16 GEMM on AMX tiles).
        self.prompt_max_rows: int | None = None
        self.max_rows = max_rows
        # The per-model rounding activations.set_model_activations chose (None: the process-wide one), for
        # prompt rows: set by the stack that builds the program.
        self.activations: str | None = None

    @staticmethod
    def build(specs: list[LayerSpec | None], max_rows: int) -> DecodeProgram | None:
        """The program of layers described by specs (None if any is None or the kernels do not run here);
        max_rows: the rows of a decode step it takes where not takes_prompts (hearth.weights.dispatch)."""
        lib = _lib()
        if lib is None or not len(specs) or any(s is None for s in specs):
            return None
        max_rows = min(max_rows, PLAN_ROWS)  # (the descriptors' kernel tables end there)
        keep: list = []
        descs = [_layer(s, keep, max_rows) for s in specs]
        if any(d is None for d in descs):
            return None
        codes = {d.kv_dtype for d in descs}
        if len(codes) != 1:
            return None
        code = codes.pop()
        dtype = next(t for t, c in _DTYPE.items() if c == code)
        hidden = descs[0].o.w.N
        if any(d.o.w.N != hidden or d.down.w.N != hidden or d.qkv.w.K != hidden or d.gate_up.w.K != hidden
               for d in descs):
            return None
        # (dense pair panels round x to bf16: the same numbers as the layer path in bf16 models only)
        takes_prompts = all(lin.any_rows and (lin.kind != 0 or dtype == torch.bfloat16)
                            for s in specs for lin in (s.qkv, s.o, s.gate_up, s.down))
        return DecodeProgram((_Layer * len(descs))(*descs), keep, hidden, dtype, takes_prompts, max_rows)

    def takes(self, x: torch.Tensor, meta, prompts_in_kernel: bool) -> bool:
        """Decode-only steps of at most max_rows tokens, in the model dtype; with takes_prompts any step whose
        attention is all the kernel's (prompts_in_kernel: no prompt handed to SDPA)."""
        if not (x.shape[0] > 0 and x.dtype == self.dtype and x.dim() == 2 and x.shape[1] == self.hidden):
            return False
        if self.takes_prompts:
            if self.prompt_max_rows is not None and x.shape[0] > self.prompt_max_rows:
                return False
            return not meta.prefills or prompts_in_kernel
        return not meta.prefills and x.shape[0] <= self.max_rows

    def run(self, x: torch.Tensor, positions: torch.Tensor, meta, int8_from: int,
            final_norm: NormSpec | None = None, owned: bool = False) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
        """x [T, hidden] (embeddings) -> (last layer's output, residual sum), or with final_norm the normalized sum.
        int8_from: rows from which quantized panels round x to one int8 term (prompt rows; see
        hearth.weights.activations.int8_from). owned: x is the caller's scratch, overwritten (else copied first)."""
        x = x if owned and x.is_contiguous() else x.contiguous().clone()
        residual = torch.empty_like(x)
        out = torch.empty_like(x) if final_norm is not None else None
        pos = positions.to(torch.int64).contiguous()
        slots = meta.slot_mapping.to(torch.int64).contiguous()
        bt = meta.block_tables
        step = _Step(x.shape[0], pos.data_ptr(), slots.data_ptr(), bt.data_ptr(), bt.stride(0),
                     meta.query_start_loc.data_ptr(), meta.context_lens.data_ptr(), meta.num_seqs, int8_from)
        norm = (None, 0.0, 0.0, None)
        if out is not None:
            norm = (final_norm.weight.data_ptr(), final_norm.offset, final_norm.eps, out.data_ptr())
        rc = _lib().hk_decoder_layers(ctypes.addressof(self.layers), len(self.layers), ctypes.addressof(step),
                                      x.data_ptr(), residual.data_ptr(), 0, self.hidden, _DTYPE[self.dtype],
                                      kernels.isa(), torch.get_num_threads(), *norm)
        if rc:
            raise RuntimeError(f"hk_decoder_layers failed with code {rc}")
        return (x, residual) if out is None else out
