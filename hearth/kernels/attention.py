"""Paged attention kernel: queries of a flat batch attend to a paged KV cache read in place (no context gather).

    from hearth.kernels import attention as attn_kernel
    if attn_kernel.supports(k_cache, head_dim):
        attn_kernel.paged_attention(q, k_cache, v_cache, block_tables, query_start, context_lens, out, scale=...)

Each selected sequence s owns flat query tokens [query_start[s], query_start[s+1]), the last of its
context_lens[s] tokens, whose K/V are already in the cache. Causal within the sequence, optional sliding window,
logit softcap and ALiBi bias, GQA. fp32, bf16, f16 or int8 caches (int8: one fp32 scale per token and kv head, so a
block filled over several steps, shared by prefix caching or written by chunked prefill never needs requantizing).
q and out are fp32 [T, H, D]. Parallel over (sequence, kv head, query tile) work items with OpenMP (torch's thread
count).
"""
from __future__ import annotations

import ctypes
import functools

import torch

from hearth import kernels
from hearth.kernels import _build

_KV_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.int8: 3}


@functools.cache
def _lib() -> ctypes.CDLL | None:
    if kernels.isa() is None:
        return None
    return _build.load()


def isa_for(head_dim: int) -> int | None:
    isa = kernels.isa()
    if isa == kernels.ISA_AVX512 and head_dim % 16:
        isa = kernels.ISA_AVX2  # AVX-512 machines run AVX2 too; its 8-float vectors fit more head sizes
    return isa if head_dim % 8 == 0 else None


def supports(kv_cache: torch.Tensor, head_dim: int) -> bool:
    """True when the kernel can run on this cache (dtype, contiguity) and head size on this machine."""
    return (kv_cache.dtype in _KV_DTYPES and kv_cache.device.type == "cpu" and kv_cache.is_contiguous()
            and isa_for(head_dim) is not None and _lib() is not None)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    query_start: torch.Tensor, context_lens: torch.Tensor, out: torch.Tensor, scale: float,
                    seq_ids: torch.Tensor | None = None, sliding_window: int | None = None,
                    logit_softcap: float | None = None, k_scale: torch.Tensor | None = None,
                    v_scale: torch.Tensor | None = None, alibi_slopes: torch.Tensor | None = None,
                    isa: int | None = None, q_is_bf16: bool = False) -> None:
    """Writes out[t] for the query tokens of the selected sequences (all when seq_ids is None).

    q, out: [T, H, D] float32, unit stride over D and head stride D. k_cache/v_cache: [num_blocks, block_size,
    Hkv, D] contiguous. block_tables [S, max_blocks], query_start [S + 1], context_lens [S], seq_ids [n]: int32,
    contiguous. int8 caches need k_scale / v_scale: float32 [num_blocks, block_size, Hkv], x = q * scale.
    alibi_slopes: float32 [H] contiguous; adds slope[head] * (key_pos - query_pos) to the scaled scores.
    q_is_bf16: q holds bf16 values (a bf16 model's, widened): prompt tiles against a bf16 cache may then compute
    scores in vdpbf16ps (AVX512-BF16), which reads q as bf16.
    NOTE: no bounds checks on block ids or lengths: the caller (the model runner) owns them.
    """
    lib = _lib()
    if lib is None:
        raise RuntimeError("hearth attention kernel is not available on this machine")
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    num_heads = q.shape[1]
    if q.dtype != torch.float32 or out.dtype != torch.float32:
        raise TypeError("q and out must be float32")
    if q.stride(2) != 1 or q.stride(1) != head_dim or out.stride(2) != 1 or out.stride(1) != head_dim:
        raise ValueError("q and out need unit stride over head_dim and head stride head_dim")
    if v_cache.shape != k_cache.shape or v_cache.dtype != k_cache.dtype or not v_cache.is_contiguous():
        raise ValueError("v_cache must match k_cache")
    for t in (block_tables, query_start, context_lens) + ((seq_ids,) if seq_ids is not None else ()):
        if t.dtype != torch.int32 or not t.is_contiguous():
            raise TypeError("block_tables, query_start, context_lens and seq_ids must be contiguous int32")
    scales = (None, None)
    if k_cache.dtype == torch.int8:
        for sc in (k_scale, v_scale):
            if sc is None or sc.dtype != torch.float32 or sc.shape != k_cache.shape[:3] or not sc.is_contiguous():
                raise ValueError("int8 caches need contiguous float32 k_scale/v_scale [num_blocks, block_size, Hkv]")
        scales = (k_scale.data_ptr(), v_scale.data_ptr())
    if alibi_slopes is not None and (alibi_slopes.dtype != torch.float32 or alibi_slopes.shape != (num_heads,)
                                     or not alibi_slopes.is_contiguous()):
        raise ValueError("alibi_slopes must be contiguous float32 [num_heads]")
    isa = isa or isa_for(head_dim)
    num_seqs = seq_ids.numel() if seq_ids is not None else context_lens.numel()
    rc = lib.hk_paged_attention(
        q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), _KV_DTYPES[k_cache.dtype], *scales,
        block_size * num_kv_heads * head_dim, num_kv_heads * head_dim, block_tables.data_ptr(),
        block_tables.stride(0), query_start.data_ptr(), context_lens.data_ptr(),
        seq_ids.data_ptr() if seq_ids is not None else None, num_seqs, out.data_ptr(), out.stride(0),
        block_size, num_heads, num_kv_heads, head_dim, scale, logit_softcap or 0.0, sliding_window or 0,
        alibi_slopes.data_ptr() if alibi_slopes is not None else None, int(q_is_bf16), isa, torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"hk_paged_attention failed with code {rc}")


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, Hkv, D] -> (int8 [T, Hkv, D], float32 scales [T, Hkv]) with x ~= q * scale (symmetric, per row)."""
    x = x.float()
    scale = x.abs().amax(dim=-1).clamp_min(1e-8) / 127.0  # [T, Hkv]
    q = torch.round(x / scale.unsqueeze(-1)).clamp_(-127, 127).to(torch.int8)
    return q, scale
