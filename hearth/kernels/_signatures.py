"""Every C export's ctypes signature, in one place (csrc/hk_api.h declares the same on the C side).

_build.load() applies them to the library once; the modules that call the kernels only check availability. A new
export is one row here.
"""
from __future__ import annotations

import ctypes

i64, i32, f32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_void_p

SIGNATURES: dict[str, tuple[list, type]] = {
    # every linear, on a weight's descriptor (linear_weight.cpp; hearth/kernels/weight.py HkWeight): x, x dtype, M,
    # ldx, const hk_weight*, bias, out, out16, kernel (weight.KERNELS), isa, threads
    "hk_linear": ([ptr, i32, i64, i64, ptr, ptr, ptr, ptr, i32, i32, i32], i32),
    # dense packing and widening (linear.cpp, panel.cpp, panel_dot.cpp, panel_rows.cpp, widen.cpp)
    "hk_linear_set_bf16_dot": ([i32], i32),
    "hk_widen": ([ptr, i32, i64, ptr, i32], i32),
    "hk_pack_panels": ([ptr, i64, i64, i64, ptr, i32], i32),
    "hk_widen_panels": ([i64, ptr, ptr, i64, ptr, i64, i32], i32),
    "hk_pack_dot_panels": ([ptr, i64, i64, i64, ptr, i32], i32),
    "hk_dot_panels_to_rows": ([ptr, i64, i64, i64, i64, ptr, i32], i32),  # (panel_rows.cpp)
    # quantized packing and dequantization (quant.cpp, quant_panel.cpp)
    "hq_pack_panels": ([ptr, i32, i64, i64, i64, ptr, i32], i32),
    "hq_pack_panels_blocks": ([ptr, i32, i64, i64, i64, i64, i64, ptr, i32], i32),
    "hq_pack_panel_scales_blocks": ([ptr, i64, i64, i64, i64, i64, ptr, i32], i32),
    "hq_dequant": ([ptr, i32, i64, i64, ptr, ptr, i64, i64, i64, i64, ptr, i32, i32, i32], i32),
    "hq_dequant_gather": ([ptr, i32, i64, i64, ptr, ptr, i64, i64, i64, ptr, i64, ptr, i32, i32, i32], i32),
    # 4-bit codebook weights, bitsandbytes NF4 / FP4 (nf4.cpp)
    "hq_nf4_dequant": ([ptr, i64, i64, ptr, i64, i64, ptr, i64, i64, ptr, i32, i32], i32),
    "hq_nf4_quantize": ([ptr, i64, i64, i64, i64, ptr, ptr, i64, ptr, i64, i32], i32),
    # attention (attention.cpp)
    "hk_paged_attention": ([
        ptr, i64,  # q, q token stride
        ptr, ptr, i32, ptr, ptr, i64, i64,  # k/v caches, dtype, k/v scales, block stride, token stride
        ptr, i64, ptr, ptr, ptr, i64,  # block tables + stride, query_start, context_lens, seq_ids, num_seqs
        ptr, i64,  # out, out token stride
        i64, i64, i64, i64, f32, f32, i64,  # block_size, heads, kv heads, head_dim, scale, softcap, window
        ptr, i32, i32, i32], i32),  # alibi slopes, q values are bf16, isa, threads
    "hk_attention_set_bf16_dot": ([i32], i32),
    # fused per-token ops (fused.cpp)
    "hk_rms_norm": ([ptr, i64, ptr, i64, ptr, f32, f32, ptr, ptr, i64, i64, i32, i32], i32),
    "hk_rope_neox": ([ptr, i64, i64, ptr, i64, i64, i64, i64, ptr, ptr, ptr, i64, i32, i32], i32),
    "hk_act_and_mul": ([ptr, i64, ptr, i64, i64, i32, i32, i32], i32),
    "hk_kv_write": ([ptr, i64, ptr, i64, ptr, ptr, ptr, i64, i64, i64], i32),
    "hk_sample": ([ptr, i64, i64, i64, ptr, ptr, ptr, i32], i32),
    "hk_argmax": ([ptr, i64, i64, i64, ptr, i32], i32),
    # the whole-stack decode program (decoder.cpp) and threads (threads.cpp)
    "hk_decoder_layers": ([ptr, i64, ptr, ptr, ptr, i32, i64, i32, i32, i32, ptr, f32, f32, ptr], i32),
    "hk_bind_threads": ([ptr, i32], i32),
    # the widest ISA the library may use (isa.cpp): 1 = AVX2 only (HEARTH_KERNELS_ISA=avx2)
    "hk_limit_isa": ([i32], i32),
}


def declare(lib: ctypes.CDLL) -> None:
    """Set every export's argtypes / restype on lib."""
    for name, (args, res) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
