"""Pre-quantized HF checkpoint formats, each repacked exactly into an existing layout of hearth.weights.layouts.

    source.py              PackedSource: one linear layer's checkpoint tensors in a format (what the loader hands
                           a layer in place of a float weight)
    bits.py                unpacking int32-packed integers (shared by the formats)
    gptq.py                GPTQ (AutoGPTQ / GPTQModel / optimum): 4-bit -> int4, 8-bit symmetric -> int8
    awq.py                 AWQ GEMM: 4-bit -> int4
    compressed_tensors.py  compressed-tensors int-quantized (W8A8) -> int8, pack-quantized (W4A16) -> int4

Every pack function returns a QWeight whose dequantization equals the format's own (q - zero) * scale bit for bit:
with 16-bit scales, q * s and zero * s are exact in fp32, so the kernels' q * s + min is too.
"""
