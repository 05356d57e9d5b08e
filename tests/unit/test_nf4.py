"""The "nf4" layout (4-bit codebook, bitsandbytes NF4 / FP4): quantize_nf4 equals bitsandbytes' quantize_4bit bit
for bit; the kernels (csrc/nf4.cpp) give the reference's floats (dequantize: exactly; linear: within fp32
summation order) at every row count dispatch sends them."""
from __future__ import annotations

import pytest
import torch

from hearth.kernels import nf4 as nf4_kernels
from hearth.platform import cpu_info
from hearth.weights import apply, dispatch, layouts
from hearth.weights.formats import bitsandbytes as bnb
from hearth.weights.packed import unpack_u4
from hearth.weights.reference import dequantize

needs_kernels = pytest.mark.skipif(not nf4_kernels.available(), reason="hearth kernels not compiled here")


def _weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    w[0, :64] = 0.0  # an all-zero block (absmax 0: bitsandbytes clamps the divisor)
    code = torch.tensor(bnb.NF4)
    w[1, :15] = (code[:-1] + code[1:]) / 2  # exactly on bitsandbytes' bucket bounds (the block's absmax: 1)
    w[1, 63] = 1.0
    return w


def test_quantize_nf4_equals_bitsandbytes_quantize_4bit() -> None:
    F = pytest.importorskip("bitsandbytes.functional")
    for dtype, kernel in ((torch.float32, True), (torch.bfloat16, True), (torch.float32, False)):
        w = _weight(48, 192).to(dtype)
        qw = bnb.quantize_nf4(w.float(), kernel=kernel)  # (hq_nf4_quantize, or its torch form)
        packed, state = F.quantize_4bit(w, blocksize=64, quant_type="nf4")
        flat = packed.reshape(-1)
        codes = torch.stack([flat >> 4, flat & 0x0F], 1).reshape(w.shape)
        assert torch.equal(unpack_u4(qw.data), codes)
        assert torch.equal(qw.scales.reshape(-1), state.absmax)
        state.dtype = torch.float32  # (its fp32 products, before any rounding to the compute dtype)
        assert torch.equal(dequantize(qw), F.dequantize_4bit(packed, state))
        assert layouts.of(qw).name == "nf4"


@needs_kernels
@pytest.mark.parametrize("n,k,group", [(37, 128, 64), (64, 384, 128), (5, 64, 32)])
def test_dequant_rows_are_the_reference_floats(n: int, k: int, group: int) -> None:
    qw = bnb.quantize_nf4(_weight(n, k), group)
    ref = dequantize(qw)
    assert torch.equal(nf4_kernels.dequant_rows(qw.data, qw.scales, group, qw.codebook, k, 0, n), ref)
    got16 = nf4_kernels.dequant_rows(qw.data, qw.scales, group, qw.codebook, k, 2, n, torch.bfloat16)
    assert torch.equal(got16, ref[2:].to(torch.bfloat16))


@needs_kernels
@pytest.mark.parametrize("n,k,group", [(37, 128, 64), (64, 384, 128), (6, 64, 32)])
def test_linear_matches_the_reference_at_every_row_count(n: int, k: int, group: int) -> None:
    qw = bnb.quantize_nf4(_weight(n, k, 1), group)
    w = dequantize(qw).double()
    bias = torch.randn(n)
    # bf16 x where vdpbf16ps runs: the weights rounded to bf16 first (bitsandbytes' bf16 dequantize)
    w16 = w.to(torch.bfloat16).double() if cpu_info().has_native_bf16 else w
    for m in (1, 2, 3, 4, 5, 8, 9, 17, 33, 80):
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(m, k).to(dtype)
            ref = x.double() @ w.t() + bias.double()
            got = apply.run_codebook(x, qw, bias)
            exact = x.double() @ (w if dtype == torch.float32 else w16).t() + bias.double()
            torch.testing.assert_close(got.double(), exact, rtol=1e-5, atol=1e-5)
            # through dispatch: the codebook kernel for few rows, dequantized tiles + GEMM for more
            y = apply.linear(x, qw, bias)
            tol = 1e-5 if dtype == torch.float32 else 3e-2  # (bf16 out; bf16 tiles in a bf16 prompt)
            torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol)


def test_dispatch_sends_few_rows_to_the_codebook_kernel() -> None:
    c = dispatch.Caps(kernels=True, avx512=True, vnni=True, gemm_mode="auto", quant_panels=True)
    lay = layouts.BY_NAME["nf4"]
    assert dispatch.plan(lay, 1, c) is dispatch.Kernel.CODEBOOK
    assert dispatch.plan(lay, dispatch.CODEBOOK_MAX_ROWS, c) is dispatch.Kernel.CODEBOOK
    assert dispatch.plan(lay, dispatch.CODEBOOK_MAX_ROWS + 1, c) is dispatch.Kernel.TILED
    # AVX2-only CPUs have the kernel too (nf4_avx2.h), at the same row counts
    avx2 = dispatch.Caps(kernels=True, avx512=False, vnni=False, gemm_mode="auto", quant_panels=True)
    assert dispatch.plan(lay, 1, avx2) is dispatch.Kernel.CODEBOOK
    assert dispatch.plan(lay, dispatch.CODEBOOK_MAX_ROWS, avx2) is dispatch.Kernel.CODEBOOK
    assert dispatch.plan(lay, dispatch.CODEBOOK_MAX_ROWS + 1, avx2) is dispatch.Kernel.TILED
    no_kernels = dispatch.Caps(kernels=False, avx512=False, vnni=False, gemm_mode="auto", quant_panels=True)
    assert dispatch.plan(lay, 1, no_kernels) is dispatch.Kernel.REFERENCE
