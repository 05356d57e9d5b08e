"""Decode program: a decoder stack's layers run in one C call per decode step (csrc/decoder.cpp).

    program = decoder.DecodeProgram.build(layers)   # None unless every layer has the supported shape
    x, residual = program.run(x, positions, meta)   # decode steps only (see `takes`)
    h = program.run(x, positions, meta, final_norm=norm)  # the same, then the model's final RMSNorm in the call

The C loop calls the same kernels, with the same rounding points, as the layers' Python forward, so results are
identical; it removes ~0.7 ms of Python per layer and step (module calls, allocations, ctypes argument packing).
Supported: pre-norm layers, or Gemma 2/3's sandwich layers (outputs of attention and MLP normalized too), with
fused-qkv attention (optional per-head q/k RMSNorm, bias, sliding window and logit softcap; no clipping or ALiBi),
NeoX rotary (a table per layer), RMSNorm, gated MLP (silu / gelu-tanh), float or hearth-quantized projections, and a
KV cache in the model dtype: the Llama family (Llama, Mistral, Qwen2, SmolLM2, TinyLlama), Qwen3, Gemma 1/2/3 and
Phi-3. Anything else (StableLM, OLMo, MoE, int8 KV cache) keeps the layer-by-layer path. HEARTH_DECODE_PROGRAM=0
turns it off.
"""
from __future__ import annotations

import ctypes
import functools
import os
from typing import TYPE_CHECKING

import torch

from hearth import kernels
from hearth.kernels import _build
from hearth.kernels import attention as attn_kernel
from hearth.kernels import fused
from hearth.kernels import panels
from hearth.kernels import quant

if TYPE_CHECKING:
    from hearth.layers.norm import RMSNorm

_DTYPE = kernels._DTYPE_CODE  # (the C dtype codes every kernel takes)
_QUANT_KIND = {"float": 1, "int8": 2, "int8x2": 3}
_ENABLED = os.environ.get("HEARTH_DECODE_PROGRAM", "1").strip().lower() not in ("0", "false", "no", "off")

i64, i32, f32, ptr = ctypes.c_int64, ctypes.c_int32, ctypes.c_float, ctypes.c_void_p


_MAX_PARTS = 4


class _Linear(ctypes.Structure):
    # A dense projection in parts (Linear.parts: q/k/v or gate/up kept as loaded): nparts > 0, part_w / part_n
    # are the parts' weights [part_n][K] in row order, and w is unused.
    _fields_ = [("kind", i32), ("w_dtype", i32), ("w", ptr), ("N", i64), ("K", i64), ("ldw", i64), ("bias", ptr),
                ("scales", ptr), ("mins", ptr), ("ldg", i64), ("group", i64), ("nparts", i64),
                ("part_w", ptr * _MAX_PARTS), ("part_n", i64 * _MAX_PARTS), ("scale_f16", i32), ("gemm_min_m", i32),
                ("bcast_min_m", i32)]


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
    if not _ENABLED or kernels.isa() is None or not kernels.available() or fused._lib() is None:
        return None
    lib = _build.load()
    lib.hk_decoder_layers.argtypes = [ptr, i64, ptr, ptr, ptr, i32, i64, i32, i32, i32, ptr, ctypes.c_float,
                                      ctypes.c_float, ptr]
    lib.hk_decoder_layers.restype = i32
    return lib


def _linear_desc(lin, keep: list) -> _Linear | None:
    """The projection's C description (None if the kernels would not take it); `keep` holds tensors it points at."""
    from hearth.layers.linear import Linear
    from hearth.layers.quant_linear import QuantLinear

    if type(lin) not in (Linear, QuantLinear):
        return None
    bias = None
    if lin.bias is not None:
        bias = lin.bias.detach().float().contiguous()
        keep.append(bias)
    qw = getattr(lin, "qweight", None)
    if qw is not None:
        keep += [qw.data, qw.scales, qw.mins]
        n, k = qw.shape
        act = qw.activations or quant.ACTIVATIONS
        if not quant.available() or not quant.supports(k, qw.group) or (
                qw.panel_rows and act == "float"):  # (panels: int8 / int8x2 only; see quant.linear)
            return None
        return _Linear(_QUANT_KIND[act], qw.kernel_code, qw.data.data_ptr(), n, k,
                       qw.data.stride(0), bias.data_ptr() if bias is not None else None, qw.scales.data_ptr(),
                       qw.mins.data_ptr() if qw.mins is not None else None, qw.scales.stride(0), qw.group,
                       scale_f16=int(qw.scale_f16), gemm_min_m=quant.gemm_min_rows(qw),
                       bcast_min_m=quant.BCAST_MIN_M)
    if type(lin) is Linear and lin.panels is not None:
        if len(lin.panels) > _MAX_PARTS:
            return None
        keep += lin.panels
        desc = _Linear(0, panels.dtype_code(), lin.panels[0].data_ptr(), sum(lin.panel_rows), lin.in_features,
                       lin.in_features, bias.data_ptr() if bias is not None else None, None, None, 0, 0)
        desc.nparts = len(lin.panels)
        for i, (p, n) in enumerate(zip(lin.panels, lin.panel_rows)):
            desc.part_w[i], desc.part_n[i] = p.data_ptr(), n
        return desc
    parts = lin.parts if type(lin) is Linear and lin.parts is not None else [lin.weight]
    keep += parts
    dtypes = {w.dtype for w in parts}
    if (len(parts) > _MAX_PARTS or len(dtypes) != 1 or dtypes.pop() not in _DTYPE
            or any(w.dim() != 2 or w.stride(1) != 1 or w.shape[0] == 0 for w in parts)
            or (len(parts) > 1 and not all(w.is_contiguous() for w in parts))):
        return None
    w = parts[0]
    desc = _Linear(0, _DTYPE[w.dtype], w.data_ptr(), sum(p.shape[0] for p in parts), w.shape[1], w.stride(0),
                   bias.data_ptr() if bias is not None else None, None, None, 0, 0)
    if len(parts) > 1:
        desc.nparts = len(parts)
        for i, p in enumerate(parts):
            desc.part_w[i], desc.part_n[i] = p.data_ptr(), p.shape[0]
    return desc


def _layer_desc(layer, keep: list) -> _Layer | None:
    from hearth.layers.activation import gelu_tanh_and_mul, silu_and_mul
    from hearth.layers.norm import RMSNorm
    from hearth.layers.rotary import RotaryEmbedding
    from hearth.models.blocks import PreNormDecoderLayer, QKVAttention
    from hearth.models.gemma2 import SandwichDecoderLayer
    from hearth.models.llama import LlamaMLP

    if type(layer) not in (PreNormDecoderLayer, SandwichDecoderLayer) or type(layer.self_attn) is not QKVAttention:
        return None
    at, mlp = layer.self_attn, layer.mlp
    a = at.attn
    qk = (at.q_norm, at.k_norm) if at.q_norm is not None else None
    if qk is not None and (not at.per_head_norm or any(type(n) is not RMSNorm for n in qk)
                           or qk[0].offset != qk[1].offset or qk[0].eps != qk[1].eps):
        return None
    if (at.clip_qkv is not None or a.alibi_slopes is not None
            or a.kv_cache is None or type(at.rotary_emb).forward is not RotaryEmbedding.forward):
        return None
    # norm1 / norm2 add the residual; Gemma 2/3's sandwich layers also normalize the attention and MLP outputs.
    if type(layer) is SandwichDecoderLayer:
        norms = (layer.input_layernorm, layer.pre_feedforward_layernorm)
        post = (layer.post_attention_layernorm, layer.post_feedforward_layernorm)
    else:
        norms, post = (layer.input_layernorm, layer.post_attention_layernorm), ()
    if any(type(n) is not RMSNorm or n.offset != norms[0].offset or n.eps != norms[0].eps for n in norms + post):
        return None
    act = {silu_and_mul: 0, gelu_tanh_and_mul: 1}.get(getattr(mlp, "act_and_mul", None))
    if act is None or type(mlp) is not LlamaMLP:
        return None
    k_cache, v_cache = a.kv_cache
    isa = attn_kernel._isa_for(a.head_dim)
    if k_cache.dtype not in _DTYPE or not attn_kernel.supports(k_cache, a.head_dim) or isa is None:
        return None
    rope = at.rotary_emb
    keep += [k_cache, v_cache, rope.cos, rope.sin]
    if rope.cos.dtype != torch.float32 or not (rope.cos.is_contiguous() and rope.sin.is_contiguous()):
        return None
    lins = [_linear_desc(m, keep) for m in (at.qkv_proj, at.o_proj, mlp.gate_up_proj, mlp.down_proj)]
    if any(d is None for d in lins):
        return None
    w1, w2 = norms[0].weight32(), norms[1].weight32()
    qn, kn = (qk[0].weight32(), qk[1].weight32()) if qk else (None, None)
    p1, p2 = (post[0].weight32(), post[1].weight32()) if post else (None, None)
    keep += [w1, w2, qn, kn, p1, p2]
    num_blocks, block_size = k_cache.shape[:2]
    return _Layer(*lins, w1.data_ptr(), w2.data_ptr(), norms[0].offset, norms[0].eps, a.num_heads, a.num_kv_heads,
                  a.head_dim, rope.rotary_dim, rope.cos.data_ptr(), rope.sin.data_ptr(), k_cache.data_ptr(),
                  v_cache.data_ptr(), _DTYPE[k_cache.dtype], act, isa, 0, num_blocks * block_size, block_size,
                  a.sliding_window or 0, a.scale, qk[0].offset if qk else 0.0,
                  qn.data_ptr() if qk else None, kn.data_ptr() if qk else None, qk[0].eps if qk else 0.0,
                  p1.data_ptr() if post else None, p2.data_ptr() if post else None, a.logit_softcap or 0.0)


class DecodeProgram:
    def __init__(self, layers: ctypes.Array, keep: list, hidden: int, dtype: torch.dtype) -> None:
        self.layers, self.hidden, self.dtype = layers, hidden, dtype
        self._keep = keep  # every tensor the descriptions point at: none may be freed while the program lives
        # Prompt steps too when every projection is a bf16 pair panel (bf16 model, AVX512-BF16) or quantized VNNI
        # panels: the same GEMM as the layer path at any row count, so only the per-layer Python goes. Other
        # weights keep prompts on the layer path (torch's GEMM for long prompts, quantized prompt tiles).
        def any_rows(lin: _Linear) -> bool:
            if lin.kind == 0:
                return lin.w_dtype == kernels.BF16_DOT_PANELS and dtype == torch.bfloat16
            return lin.w_dtype in quant.PANEL_CODES

        self.takes_prompts = all(any_rows(getattr(layer, name))
                                 for layer in layers for name in ("qkv", "o", "gate_up", "down"))
        # The per-model rounding quant.set_model_activations chose (None: the process-wide one), for prompt rows.
        self.activations: str | None = None

    @staticmethod
    def build(layers) -> DecodeProgram | None:
        lib = _lib()
        if lib is None or not len(layers):
            return None
        keep: list = []
        descs = [_layer_desc(layer, keep) for layer in layers]
        if any(d is None for d in descs):
            return None
        codes = {d.kv_dtype for d in descs}
        if len(codes) != 1:
            return None
        code = codes.pop()
        dtype = next(t for t, c in _DTYPE.items() if c == code)
        hidden = descs[0].o.N
        if any(d.o.N != hidden or d.down.N != hidden or d.qkv.K != hidden or d.gate_up.K != hidden for d in descs):
            return None
        program = DecodeProgram((_Layer * len(descs))(*descs), keep, hidden, dtype)
        program.activations = next((q.activations for layer in layers for m in layer.modules()
                                    if (q := getattr(m, "qweight", None)) is not None), None)
        return program

    def takes(self, x: torch.Tensor, meta) -> bool:
        """Decode-only steps of at most the decode kernels' token count, in the model dtype; with takes_prompts
        any step whose attention is all the kernel's (no prompt handed to SDPA)."""
        if not (x.shape[0] > 0 and x.dtype == self.dtype and x.dim() == 2 and x.shape[1] == self.hidden):
            return False
        if self.takes_prompts:
            from hearth.layers.attention import _sdpa_min_prompt

            return not meta.prefills or _sdpa_min_prompt() is None
        return not meta.prefills and x.shape[0] <= kernels.MAX_KERNEL_M

    def run(self, x: torch.Tensor, positions: torch.Tensor, meta, final_norm: RMSNorm | None = None,
            owned: bool = False) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
        """x [T, hidden] (embeddings) -> (last layer's output, residual sum), or with final_norm the normalized sum
        (final_norm(x, residual)[0]). owned: x is the caller's scratch, overwritten (else copied first)."""
        x = x if owned and x.is_contiguous() else x.contiguous().clone()
        residual = torch.empty_like(x)
        out = torch.empty_like(x) if final_norm is not None else None
        pos = positions.to(torch.int64).contiguous()
        slots = meta.slot_mapping.to(torch.int64).contiguous()
        bt = meta.block_tables
        step = _Step(x.shape[0], pos.data_ptr(), slots.data_ptr(), bt.data_ptr(), bt.stride(0),
                     meta.query_start_loc.data_ptr(), meta.context_lens.data_ptr(), meta.num_seqs,
                     quant._int8_from(x.shape[0], self.activations))  # (prompt rows' rounding: quant.prompt_rows)
        norm = (None, 0.0, 0.0, None)
        if out is not None:
            norm = (final_norm.weight32().data_ptr(), final_norm.offset, final_norm.eps, out.data_ptr())
        rc = _lib().hk_decoder_layers(ctypes.addressof(self.layers), len(self.layers), ctypes.addressof(step),
                                      x.data_ptr(), residual.data_ptr(), 0, self.hidden, _DTYPE[self.dtype],
                                      kernels.isa(), torch.get_num_threads(), *norm)
        if rc:
            raise RuntimeError(f"hk_decoder_layers failed with code {rc}")
        return (x, residual) if out is None else out
