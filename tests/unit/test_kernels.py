"""hearth.kernels: the C++ decode linear kernels agree with F.linear (skipped where they cannot run)."""

import pytest
import torch
import torch.nn.functional as F

from hearth import kernels
from hearth.kernels import weight
from hearth.weights import apply, dispatch

needs_kernels = pytest.mark.skipif(not kernels.available(), reason="hearth kernels unavailable (no AVX2 or compiler)")


def _reference(x, w, bias):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny problems: torch's thread pool only adds latency (badly so on a busy machine)
    try:
        return F.linear(x.float(), w.float(), None if bias is None else bias.float())
    finally:
        torch.set_num_threads(threads)


def _close(got, want, tol=1e-4):
    # (not torch.testing.assert_close: its first call imports torch.distributed.tensor, ~5 s)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    assert torch.allclose(got, want, rtol=tol, atol=tol), f"max abs diff {(got - want).abs().max().item():.3g}"


def _isas():
    isas = [kernels.ISA_AVX2] if kernels.isa() is not None else []
    if kernels.isa() == kernels.ISA_AVX512:
        isas.append(kernels.ISA_AVX512)
    return isas


@needs_kernels
@pytest.mark.parametrize("wdtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("K", [64, 896, 2048])
@pytest.mark.parametrize("N", [5, 130, 2048])
def test_matches_f_linear(wdtype, K, N):
    g = torch.Generator().manual_seed(K * 7 + N)
    w = (torch.randn(N, K, generator=g) / K**0.5).to(wdtype)
    bias = torch.randn(N, generator=g)
    wf = w.float()
    for isa in _isas():
        for M in (1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 64):
            x = torch.randn(M, K, generator=g)
            for b in (None, bias):
                got = kernels.run_linear(x, w, b, isa_code=isa)
                assert got.dtype == torch.float32 and got.shape == (M, N)
                _close(got, _reference(x, wf, b))


@needs_kernels
@pytest.mark.parametrize("K", [7, 40, 100])  # not a multiple of the 16/32-wide chunk: scalar tail
def test_ragged_k_and_k_blocks(K):
    g = torch.Generator().manual_seed(K)
    w = torch.randn(37, K, generator=g).bfloat16()
    bias = torch.randn(37, generator=g)
    for M in (1, 2, 3, 4, 6, 8, 9):  # up to 4 x rows have their own path (row streams)
        x = torch.randn(M, K, generator=g)
        for isa in _isas():
            for kblock in (0, 16, 32):
                _close(kernels.run_linear(x, w, bias, kblock=kblock, isa_code=isa), _reference(x, w, bias))


@needs_kernels
def test_dtypes_strides_and_public_api():
    g = torch.Generator().manual_seed(0)
    w_full = torch.randn(300, 256, generator=g).bfloat16()
    w = w_full[10:139]  # a row slice: contiguous rows, offset data pointer
    x = torch.randn(4, 512, generator=g)[:, ::2]  # non-unit stride along K
    bias = torch.randn(129, generator=g).bfloat16()
    ref = _reference(x, w, bias)
    _close(apply.dense_linear(x, w, bias), ref)
    y = apply.dense_linear(x.bfloat16(), w, bias)  # bf16 activations -> bf16 output
    assert y.dtype == torch.bfloat16
    _close(y.float(), _reference(x.bfloat16(), w, bias), tol=2e-2)
    _close(apply.dense_linear(x, w.half()), _reference(x, w.half(), None))
    _close(apply.dense_linear(x, w.float()), _reference(x, w, None))
    # The dispatch: leading dims, both sides of the dense kernel's row limit, matching F.linear's output dtype.
    limit = dispatch.caps().dense_max_rows
    for m in (1, limit, limit + 1):
        x3 = torch.randn(1, m, 256, generator=g)
        _close(apply.dense_linear(x3, w, bias), _reference(x3, w, bias))


def test_linear_falls_back_without_kernels(monkeypatch):
    monkeypatch.setattr(kernels, "available", lambda: False)
    x, w, b = torch.randn(2, 16), torch.randn(3, 16).bfloat16(), torch.randn(3)
    _close(apply.dense_linear(x, w, b), _reference(x, w, b))
    x64 = torch.randn(2, 16, dtype=torch.float64)
    _close(apply.dense_linear(x64, w.double(), None), F.linear(x64, w.double()))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [1, 7, 8, 1001, 70_000])
def test_widen_is_exact(dtype: torch.dtype, n: int) -> None:
    if not kernels.available():
        pytest.skip("kernels unavailable")
    t = (torch.randn(n) * 3).to(dtype)
    assert torch.equal(kernels.widen(t), t.float())
    w = t.reshape(1, n)
    got = kernels.widen(w, scratch=True)
    assert got.shape == w.shape and torch.equal(got, w.float())
    # the scratch buffer is reused: a second, smaller call reads its own values
    small = t[: max(1, n // 2)].reshape(1, -1)
    assert torch.equal(kernels.widen(small, scratch=True), small.float())


def _bf16_dot_here() -> bool:
    from hearth.kernels import _build

    lib = _build.load()
    return lib is not None and kernels.isa() == kernels.ISA_AVX512 and lib.hk_linear_set_bf16_dot(1) == 1


@needs_kernels
@pytest.mark.skipif(not _bf16_dot_here(), reason="no AVX512-BF16 here: the vdpbf16ps kernel cannot run")
@pytest.mark.parametrize("K", [64, 100, 896, 4864])  # 100: a 4-value fp32 tail after three 32-value chunks
def test_bf16_dot_kernel_matches_float64(K):
    """bf16 x . bf16 w in vdpbf16ps (the default where the CPU has AVX512-BF16): every product is exact, so the fp32
    result is within fp32 summation error of float64, like the fp32-FMA kernel's, on every path (row streams for
    up to 4 rows, register tiles above, K blocks, several parts)."""
    from hearth.kernels import _build

    lib = _build.load()
    g = torch.Generator().manual_seed(K)
    parts = [(torch.randn(n, K, generator=g) / K**0.5).bfloat16() for n in (37, 130)]
    w = torch.cat(parts)
    bias = torch.randn(w.shape[0], generator=g)

    def run(x, kblock, dot):
        lib.hk_linear_set_bf16_dot(int(dot))
        out = torch.empty(x.shape[0], w.shape[0])
        weight.linear(x, weight.dense(parts, kblock=kblock), bias, out, isa_code=kernels.ISA_AVX512)
        return out

    try:
        for M in (1, 2, 3, 4, 5, 8, 17, 64):
            x = torch.randn(M, K, generator=g).bfloat16()
            want = (x.double() @ w.double().t() + bias.double()).float()
            for kblock in (0, 64):
                fma, dot = run(x, kblock, False), run(x, kblock, True)
                _close(dot, want, tol=1e-5)
                _close(fma, want, tol=1e-5)
    finally:
        lib.hk_linear_set_bf16_dot(1)
