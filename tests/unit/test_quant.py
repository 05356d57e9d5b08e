"""Weight-only quantization: kernels vs the dequantized reference, GGUF repacks vs gguf.quants, QuantLinear loading."""
import dataclasses
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q

from hearth import envs, kernels
from hearth.kernels import quant as qkernels
from hearth.layers.linear import Linear
from hearth.layers.quant_linear import QuantLinear, parse_scheme, quantize_model
from hearth.weights import activations
from hearth.weights import apply
from hearth.weights import dispatch
from hearth.weights import gguf as gguf_w
from hearth.weights import layouts
from hearth.weights import packed
from hearth.weights import prepare
from hearth.weights import quantize
from hearth.weights import reference
from hearth.weights import relayout
from hearth.weights.gguf import KEPT_NAMES, GGUFBlocks

needs_kernels = pytest.mark.skipif(not qkernels.available(), reason="hearth kernels unavailable (no AVX2 or compiler)")


def _isas() -> list[int]:
    isas = [kernels.ISA_AVX2] if kernels.isa() is not None else []
    if kernels.isa() == kernels.ISA_AVX512:
        isas.append(kernels.ISA_AVX512)
    return isas


def _reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny problems: the thread pool only adds latency on a busy machine
    try:
        return F.linear(x.float(), w, bias)
    finally:
        torch.set_num_threads(threads)


def _close(got: torch.Tensor, want: torch.Tensor, tol: float = 1e-4) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = want.abs().max().item() + 1.0
    assert torch.allclose(got, want, rtol=tol, atol=tol * scale), f"max abs diff {(got - want).abs().max():.3g}"


def _qweights(w: torch.Tensor) -> list[packed.QWeight]:
    k = w.shape[1]
    # (int8 group 16: GGUF Q6_K's layout, two scales per block of 32)
    out = [quantize.quantize_int8(w), quantize.quantize_int8(w, 32), quantize.quantize_int8(w, 16), quantize.quantize_int4(w, 32)]
    out += [quantize.quantize_int4(w, g) for g in (64, 128) if k % g == 0]
    # symmetric int4 (GGUF Q4_0's layout): no mins stored, min = -8 * scale
    out += [dataclasses.replace(quantize.quantize_int4(w, g), mins=None) for g in (32, 64) if k % g == 0]
    # fp16 scales (and mins), as GGUF Q8_0 / Q4_0 / Q4_1 keep them
    out += [dataclasses.replace(q, scales=q.scales.half(), mins=None if q.mins is None else q.mins.half())
            for q in (out[1], out[2], out[-1])]
    # int8 with groups of 2 blocks (the AVX-512 M = 1 kernel's general scale walk)
    out += [quantize.quantize_int8(w, 64)] if k % 64 == 0 else []
    return out


def _default_reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """What apply.linear's kernel computes with the process-wide activation mode (activations.rounding())."""
    return {"int8": _act_reference, "int8x2": _x2_reference}.get(activations.rounding(), _reference)(x, w, bias)


def _act_reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """What the int8-activation kernels compute: the int8-rounded x times the dequantized weights."""
    return _reference(activations.quantize_x(x.float().reshape(-1, x.shape[-1])).reshape(x.shape), w, bias)


def _x2_reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """What the two-term ("int8x2") kernels compute: the two-term x (quantize_activations_x2) times the weights."""
    return _reference(activations.quantize_x2(x.float().reshape(-1, x.shape[-1])).reshape(x.shape), w, bias)


@needs_kernels
@pytest.mark.parametrize("N,K", [(5, 32), (130, 576), (257, 896), (64, 1536), (37, 96)])
def test_kernel_matches_dequantized_reference(N: int, K: int) -> None:
    g = torch.Generator().manual_seed(N * 31 + K)
    w = torch.randn(N, K, generator=g) / K**0.5
    bias = torch.randn(N, generator=g)
    qws = _qweights(w) + ([quantize.quantize_int4(w, 96)] if K % 96 == 0 else [])  # odd block count, odd group
    for qw in qws:
        wd = reference.dequantize(qw)
        for isa in _isas():
            assert torch.equal(apply.dequantize_rows(qw, 0, N, isa_code=isa), wd)
            for M in (1, 2, 5, 8, 33):
                x = torch.randn(M, K, generator=g)
                for b in (None, bias):
                    _close(apply.run(x, qw, b, isa_code=isa, call="float"), _reference(x, wd, b))
                    # the integer dot products are exact: only fp32 summation order differs
                    _close(apply.run(x, qw, b, isa_code=isa, call="int8"), _act_reference(x, wd, b))
                    _close(apply.run(x, qw, b, isa_code=isa, call="int8x2"), _x2_reference(x, wd, b))
                    if isa == kernels.ISA_AVX512 and qw.group != 16:  # fp32 x (any M runs; see gemm_min_rows)
                        _close(apply.run(x, qw, b, isa_code=isa, call="gemm"), _reference(x, wd, b))
                        _close(apply.run(x, qw, b, isa_code=isa, call="bcast"), _reference(x, wd, b))


@needs_kernels
def test_dequantize_gather_equals_reference_rows() -> None:
    """The embedding lookup of quantized tables: rows by id, repeated and unordered, one thread and parallel."""
    g = torch.Generator().manual_seed(7)
    w = torch.randn(130, 576, generator=g)
    q4 = quantize.quantize_int4(w, 32)
    qws = _qweights(w) + [dataclasses.replace(q4, scales=q4.scales.half(), mins=q4.mins.half())]  # fp16 (GGUF)
    for qw in qws:
        for ids in (torch.tensor([5, 0, 129, 5]), torch.randint(0, 130, (300,), generator=g)):  # 300 x 576: parallel
            assert torch.equal(apply.dequantize_gather(qw, ids), reference.dequantize(qw)[ids])
        with pytest.raises(IndexError):
            apply.dequantize_gather(qw, torch.tensor([3, 130]))


@needs_kernels
@pytest.mark.parametrize("N,K", [(64, 576), (32, 2048)])
def test_int8_activations_error_bound(N: int, K: int) -> None:
    """int8 activations vs exact fp32 x: per block of 32, |x - dx * qx| <= dx / 2 (dx = amax / 127), so
    |y_int8 - y| <= sum_k |w[n, k]| * dx[block(k)] / 2 -- a hard bound, typically ~1/254 of sum |w| * |amax|
    (plus fp32 rounding), not a statistical tolerance."""
    g = torch.Generator().manual_seed(K)
    w = torch.randn(N, K, generator=g) / K**0.5
    x = torch.randn(8, K, generator=g) * torch.rand(8, K, generator=g) * 4  # uneven magnitudes per block
    x[:, 5] = 30.0  # an outlier: its block's other elements get a coarse step
    for qw in _qweights(w):
        wd = reference.dequantize(qw)
        dx = x.reshape(8, K // 32, 32).abs().amax(-1) / 127.0
        bound = (wd.abs() @ dx.repeat_interleave(32, dim=1).t() / 2).t() * (1 + 1e-3) + 1e-4
        err = (apply.run(x, qw, None, call="int8") - _reference(x, wd, None)).abs()
        assert (err <= bound).all(), (err - bound).max()
        assert torch.equal(activations.quantize_x(activations.quantize_x(x)), activations.quantize_x(x))


@needs_kernels
@pytest.mark.parametrize("N,K", [(64, 576), (32, 2048)])
def test_int8x2_activations_error_bound(N: int, K: int) -> None:
    """Two-term activations vs exact fp32 x: per block of 32, |x - d2 * (254 q1 + q2)| <= d2 / 2 with
    d2 = amax / (127 * 254), so |y_x2 - y| <= sum_k |w[n, k]| * d2[block(k)] / 2 (a hard bound, plus fp32 rounding of
    the reconstruction and the sums: the 1e-6 relative slack, 254 x below the int8 mode's bound)."""
    g = torch.Generator().manual_seed(K + 1)
    w = torch.randn(N, K, generator=g) / K**0.5
    x = torch.randn(8, K, generator=g) * torch.rand(8, K, generator=g) * 4  # uneven magnitudes per block
    x[:, 5] = 30.0  # an outlier
    x[:, 40:72] = torch.arange(32) * 0.25 - 4.0  # exact half-step residuals
    x[:, 100:132] = 0.0  # an all-zero block
    xr = activations.quantize_x2(x)
    d2 = x.reshape(8, K // 32, 32).abs().amax(-1) / 127.0 / 254.0
    assert ((xr - x).abs() <= (d2 / 2 * (1 + 1e-3)).repeat_interleave(32, dim=1) + 1e-6 * x.abs()).all()
    assert torch.equal(xr[:, 100:132], torch.zeros(8, 32))
    ref = x.double()
    for qw in _qweights(w):
        wd = reference.dequantize(qw)
        bound = (wd.abs() @ d2.repeat_interleave(32, dim=1).t() / 2).t() * (1 + 1e-3)
        bound += 1e-6 * (wd.abs() @ x.abs().t()).t() + 1e-6  # fp32 rounding of x's reconstruction and of the sums
        y = apply.run(x, qw, None, call="int8x2")
        err = (y.double() - (ref @ wd.double().t())).abs()
        assert (err <= bound).all(), (err - bound).max()
        err8 = (apply.run(x, qw, None, call="int8").double() - (ref @ wd.double().t())).abs()
        assert err.max() * 20 < err8.max()  # far tighter than the int8 mode


@needs_kernels
def test_several_rows_take_the_gemm_where_it_is_ahead() -> None:
    """apply.linear's kernel choice by rows: from gemm_min_rows (AVX-512: 4 for int8, 8 for int4; VNNI: BCAST_MIN_M) to
    GEMM_MAX_M the fp32-x GEMM (the dequantized float model's results; from BCAST_MIN_M rows in broadcast form), below
    it the int8x2 kernels, above it dequantized tiles + torch; inside prompt_rows any count up to GEMM_MAX_M takes the
    GEMM's dot form, whose rows do not depend on each other (a prompt's last row alone = that row inside the whole
    prompt); the 6-bit tiles never take it."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(64, 512, generator=g) / 16
    for qw in (quantize.quantize_int8(w), relayout.tile_rows4(quantize.quantize_int4(w, 32))):
        rows = _gemm_from(qw)
        if kernels.isa() != kernels.ISA_AVX512:
            assert rows == 0
            continue
        if rows == 0:  # HEARTH_QUANT_GEMM=0 keeps the integer kernels
            continue
        # VNNI (HEARTH_QUANT_GEMM auto): integer dots up to the broadcast form's rows
        assert rows == (dispatch.BCAST_MIN_M if (dispatch.caps().gemm_mode == "auto" and dispatch.caps().vnni) else 4 if qw.bits == 8 else 8)
        for m in (1, rows - 1, rows, 33, dispatch.GEMM_MAX_M):
            x = torch.randn(m, 512, generator=g)
            act = "bcast" if m >= dispatch.BCAST_MIN_M else "gemm" if m >= rows else activations.rounding()
            want = apply.run(x, qw, None, call=act)
            assert torch.equal(apply.linear(x, qw), want), m
            with activations.prompt_rows():
                got = apply.linear(x, qw)
            assert torch.equal(got, apply.run(x, qw, None, call="gemm")), m
            assert torch.equal(got[-1:], apply.run(x[-1:], qw, None, call="gemm")), m  # row-independent
        x = torch.randn(dispatch.GEMM_MAX_M + 1, 512, generator=g)
        with activations.prompt_rows():
            assert torch.equal(apply.linear(x, qw), apply.tiled(x, qw, None))
    q6 = dataclasses.replace(quantize.quantize_int8(w), bits=6)
    assert _gemm_from(q6) == 0 and _gemm_from(quantize.quantize_int8(w, 16)) == 0


@needs_kernels
def test_linear_dispatch_dtypes_strides_and_prefill() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 256, generator=g) / 16
    qw = quantize.quantize_int4(w, 64)
    wd = reference.dequantize(qw)
    for shape in ((1, 1), (2, 7), (1, dispatch.MAX_QUANT_ROWS)):  # kernel (x rows in chunks of 32)
        x = torch.randn(*shape, 300, generator=g)[..., 10:266]  # strided rows
        _close(apply.linear(x, qw), _default_reference(x, wd, None))
    x = torch.randn(2, dispatch.MAX_QUANT_ROWS + 5, 300, generator=g)[..., 10:266]  # dequantized tiles + torch GEMM
    _close(apply.linear(x, qw), _reference(x, wd, None))
    x = torch.randn(3, 256, generator=g)
    for dt in (torch.bfloat16, torch.float16):
        y = apply.linear(x.to(dt), qw)
        assert y.dtype == dt
        _close(y.float(), _default_reference(x.to(dt), wd, None), tol=1e-2)


def test_quantize_error_bounds() -> None:
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
    q8 = quantize.quantize_int8(w)
    assert (reference.dequantize(q8) - w).abs().max() <= q8.scales.max() / 2 + 1e-6
    q4 = quantize.quantize_int4(w, 32)
    assert q4.data.shape == (64, 128) and q4.scales.shape == (64, 8)
    assert (reference.dequantize(q4) - w).abs().max() <= q4.scales.max() / 2 + 1e-5
    q = torch.randint(0, 16, (3, 64), dtype=torch.uint8)
    assert torch.equal(packed.unpack_u4(packed.pack_u4(q)), q)


def _k_blocks(qtype: Q, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Random but valid Q4_K / Q6_K rows (gguf.quants cannot quantize these): finite fp16 d (and dmin), any other
    bytes (Q6_K's int8 scales included)."""
    rng = np.random.default_rng(seed)
    nb = k // 256
    size, fp16_at = {Q.Q4_K: (144, (0, 2)), Q.Q6_K: (210, (208,))}[qtype]
    raw = rng.integers(0, 256, (n, nb, size), dtype=np.uint8)
    for at in fp16_at:
        raw[:, :, at:at + 2] = (rng.standard_normal((n, nb, 1)) * 0.01).astype(np.float16).view(np.uint8)
    return raw.reshape(n, nb * size)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q6_K])
def test_gguf_repack_equals_gguf_dequantize(qtype: Q) -> None:
    n, k = 37, 512
    if qtype in (Q.Q4_K, Q.Q6_K):
        raw = _k_blocks(qtype, n, k)
    else:
        raw = gguf.quants.quantize(np.random.default_rng(2).standard_normal((n, k)).astype(np.float32), qtype)
    blocks = GGUFBlocks(int(qtype), (n, k), torch.from_numpy(raw.copy()))
    qw = blocks.repack()
    assert qw.bits == (8 if qtype in (Q.Q8_0, Q.Q6_K) else 4) and qw.group == (16 if qtype == Q.Q6_K else 32)
    assert (qw.mins is None) == (qtype in (Q.Q8_0, Q.Q4_0, Q.Q6_K))  # Q4_0 is symmetric: its mins are implied
    assert qw.scale_f16 == (qtype not in (Q.Q4_K, Q.Q6_K))  # the file's fp16 scales as stored; d * sc needs fp32
    ref = torch.from_numpy(gguf.quants.dequantize(raw, qtype))
    assert torch.equal(reference.dequantize(qw), ref)  # bit-exact: the kernel's fma gives these same floats
    assert torch.equal(blocks.dequantize(), ref)
    perm = torch.randperm(n)
    assert torch.equal(reference.dequantize(blocks.index_rows(perm).repack()), ref[perm])
    if qkernels.available():
        x = torch.randn(3, k)
        _close(apply.linear(x, qw), _default_reference(x, ref, None))
        _close(apply.run(x, qw, None, call="float"), _reference(x, ref, None))


def test_quant_linear_merged_shards_and_dense_fallback() -> None:
    g = torch.Generator().manual_seed(3)
    shards = {"q": 64, "k": 32, "v": 32}
    ws = {name: torch.randn(rows, 256, generator=g) for name, rows in shards.items()}
    x = torch.randn(4, 256, generator=g)
    # int4 computed at load: equals the dequantized weights of each shard quantized alone (rows are independent)
    lin = QuantLinear(256, 128, bias=True, shard_sizes=shards, scheme="int4-g64")
    for name, w in ws.items():
        lin.load_shard("weight", name, w)
    lin.load_shard("bias", None, torch.arange(128.0))
    assert lin.qweight is not None and lin.qweight.group == 64 and lin.weight.dtype == torch.uint8
    wd = torch.cat([reference.dequantize(quantize.quantize_int4(w, 64)) for w in ws.values()])
    ref = _default_reference if qkernels.available() else _reference
    _close(lin(x), ref(x, wd, torch.arange(128.0)))
    # gguf: all shards Q4_0/Q4_1 -> int4; a Q8_0 shard among them -> dense, exactly the dequantized floats
    raws = {name: (qt, gguf.quants.quantize(w.numpy(), qt))
            for (name, w), qt in zip(ws.items(), (Q.Q4_0, Q.Q4_1, Q.Q4_0))}
    for mixed in (False, True):
        lin = QuantLinear(256, 128, shard_sizes=shards, scheme="gguf")
        for name, (qt, raw) in raws.items():
            qt = Q.Q8_0 if mixed and name == "v" else qt
            raw = gguf.quants.quantize(ws[name].numpy(), qt) if mixed and name == "v" else raw
            lin.load_shard("weight", name, GGUFBlocks(int(qt), tuple(raw.shape[:1]) + (256,), torch.from_numpy(raw)))
        assert (lin.qweight is None) == mixed
    # shards with fp16 (Q4_1) and fp32 (Q4_K) scales: all widened to fp32, exactly
    lin = QuantLinear(256, 128, shard_sizes=shards, scheme="gguf")
    parts = {}
    for name, rows in shards.items():
        qt = Q.Q4_K if name == "k" else Q.Q4_1
        raw = _k_blocks(Q.Q4_K, rows, 256, seed=rows) if qt == Q.Q4_K else gguf.quants.quantize(ws[name].numpy(), qt)
        parts[name] = GGUFBlocks(int(qt), (rows, 256), torch.from_numpy(np.ascontiguousarray(raw)))
        lin.load_shard("weight", name, parts[name])
    assert lin.qweight is not None and not lin.qweight.scale_f16 and lin.qweight.mins.dtype == torch.float32
    assert torch.equal(reference.dequantize(lin.qweight), torch.cat([p.dequantize() for p in parts.values()]))
    with pytest.raises(ValueError, match="shape mismatch"):
        QuantLinear(256, 128, scheme="int8").load_shard("weight", None, torch.zeros(128, 255))


def test_int4_group_falls_back_to_divisor_and_scheme_names() -> None:
    lin = QuantLinear(576, 8, scheme="int4")  # 576 = 9 * 64: group 128 does not divide it
    lin.load_shard("weight", None, torch.randn(8, 576))
    assert lin.qweight.group == 64
    assert parse_scheme(None, True) == "gguf" and parse_scheme("auto", False) is None
    assert parse_scheme("none", True) is None and parse_scheme("int8", False) == "int8"
    with pytest.raises(ValueError, match="--quantization"):
        parse_scheme("int3", False)


def test_quantize_model_skips_lm_head() -> None:
    model = torch.nn.Module()
    model.layer = torch.nn.Module()
    model.layer.proj = Linear(64, 32)
    model.lm_head = Linear(64, 100)
    assert quantize_model(model, "int8") == 1
    assert type(model.layer.proj) is QuantLinear and type(model.lm_head) is Linear


def test_gguf_loader_raw_blocks_match_dequantized(tmp_path: Path) -> None:
    from hearth.loader.gguf import load_gguf
    from tests.unit.test_gguf_loader import write_llama

    for qtype in (Q.Q4_0, Q.Q8_0):
        path = tmp_path / f"m-{qtype.name}.gguf"
        write_llama(path, qtype)
        ck = load_gguf(str(path))
        dense = dict(ck.tensors(torch.float32))
        raw = dict(ck.tensors(torch.float32, KEPT_NAMES))
        assert dense.keys() == raw.keys()
        kept = [n for n, t in raw.items() if isinstance(t, GGUFBlocks)]
        assert "model.layers.0.self_attn.q_proj.weight" in kept and "model.layers.0.self_attn.k_proj.weight" in kept
        # the embedding table stays in blocks too (row lookups dequantize); the head comes from head_blocks()
        assert "model.embed_tokens.weight" in kept and not any(n.startswith("lm_head") for n in kept)
        for name in kept:  # q/k rows un-permuted on the raw rows give the same weights
            exact = reference.dequantize(raw[name].repack())
            assert torch.equal(exact, raw[name].dequantize()), name
            if "embed_tokens" in name:  # the dense table is exact
                assert dense[name].dtype == torch.float32 and torch.equal(exact, dense[name]), name
                continue
            # the dense path hands block types to a float32 model as float16
            assert dense[name].dtype == torch.float16 and torch.equal(exact.half(), dense[name]), name


def _assert_same_results(t: packed.QWeight, plain: packed.QWeight, g: torch.Generator, zmm_order: bool = False) -> None:
    """Every kernel path (each ISA, M = 1 / 3 / 40, each activation mode, dequantized rows, gathers) gives
    bit-identical results on the tiled weight t and its plain layout; zmm_order: except the AVX-512 integer-dot
    kernels, which sum the same products in another fp32 order (then equal up to that rounding)."""
    n, k = plain.shape
    bias = torch.randn(n, generator=g)
    for isa in _isas():
        for m in (1, 3, 40):
            x = torch.randn(m, k, generator=g)
            for act in ("int8", "int8x2", "float") + (("gemm", "bcast") if isa == kernels.ISA_AVX512 and t.bits == 4
                                                      else ()):
                got, want = apply.run(x, t, bias, isa, act), apply.run(x, plain, bias, isa, act)
                if zmm_order and isa == kernels.ISA_AVX512 and act != "float":
                    _close(got, want, tol=1e-6)
                else:
                    assert torch.equal(got, want), (isa, m, act)
    assert torch.equal(apply.dequantize_rows(t, 1, n - 2), apply.dequantize_rows(plain, 1, n - 2))
    ids = torch.tensor([n - 1, 0, 2, 1, 2])
    assert torch.equal(apply.dequantize_gather(t, ids), apply.dequantize_gather(plain, ids))


@pytest.mark.parametrize("N,K", [(8, 64), (12, 576), (16, 896), (4, 2048), (20, 1536)])
def test_int4_tiles_are_exact(N: int, K: int) -> None:
    """4-row tiles (the decode layout of int4-g32) are a byte permutation: every kernel path gives bit-identical
    results to the plain layout, for fp16 / fp32 scales, with and without mins, K % 256 != 0 tails included."""
    g = torch.Generator().manual_seed(N + K)
    w = torch.randn(N, K, generator=g)
    q = quantize.quantize_int4(w, 32)
    for qw in (q, dataclasses.replace(q, mins=None), dataclasses.replace(q, scales=q.scales.half(), mins=q.mins.half()),
               dataclasses.replace(q, scales=q.scales.half(), mins=None)):
        t = relayout.tile_rows4(qw)
        assert t.tiled and t.shape == qw.shape and t.nbytes() == qw.nbytes()
        assert layouts.of(t).code == (2 if qw.mins is None else 3) and t.scale_f16 == qw.scale_f16
        back = relayout.untile_rows4(t)
        assert torch.equal(back.data, qw.data) and torch.equal(back.scales, qw.scales)
        assert (back.mins is None) == (qw.mins is None) and (qw.mins is None or torch.equal(back.mins, qw.mins))
        assert torch.equal(reference.dequantize(t), reference.dequantize(qw))
        ids = torch.tensor([N - 1, 0, 2, 1, 2])
        assert torch.equal(reference.dequantize(relayout.plain(t).index_rows(ids)), reference.dequantize(qw.index_rows(ids)))
        if qkernels.available():
            _assert_same_results(t, qw, g)
    with pytest.raises(ValueError, match="tile_rows4"):
        relayout.tile_rows4(quantize.quantize_int4(w, 64) if K % 64 == 0 else quantize.quantize_int8(w))
    with pytest.raises(ValueError, match="tile_rows4"):
        relayout.tile_rows4(quantize.quantize_int4(w[:N - 1], 32))


@needs_kernels
@pytest.mark.parametrize("K", [256, 576])
def test_a_rows_dot_result_does_not_depend_on_the_rows_beside_it(K: int) -> None:
    """A decode step batches sequences: on AVX2 each row's integer-dot result equals that row's alone, bit for bit
    (int4 and 6-bit tiles unpack a tile once for 4 rows of x; int8 rows run 4 rows of x per weight row), at row
    counts that leave 1-3 rows over; K 576 leaves a record's tail."""
    g = torch.Generator().manual_seed(K)
    n, rows = 12, 9
    w = torch.randn(n, K, generator=g)
    q4 = quantize.quantize_int4(w, 32)
    weights = [relayout.tile_rows4(q4), relayout.tile_rows4(dataclasses.replace(q4, mins=None)),
               relayout.tile_rows4(dataclasses.replace(q4, scales=q4.scales.half(), mins=q4.mins.half())), q4,
               quantize.quantize_int8(w)]
    if K % 256 == 0:  # GGUF Q6_K in 6-bit tiles (an LM head)
        q6 = torch.from_numpy(np.ascontiguousarray(_k_blocks(Q.Q6_K, n, K, seed=K)))
        weights.append(gguf_w.repack_q6_tiles(GGUFBlocks(int(Q.Q6_K), (n, K), q6)))
    # int8 in groups (GGUF Q8_0's 32 with fp16 scales, 64, 16-weight groups), a -128 weight, and an odd row count
    # (int8 rows take 2 weight rows per tile at several x rows)
    q8 = quantize.quantize_int8(w, 32)
    q8.data[0, 0] = -128
    weights += [q8, dataclasses.replace(q8, scales=q8.scales.half()), quantize.quantize_int8(w, 64),
                quantize.quantize_int8(w, 16), quantize.quantize_int8(w[:n - 1])]
    bias = torch.randn(n, generator=g)
    x = torch.randn(rows, K, generator=g)
    for qw in weights:
        b = bias[:qw.shape[0]]
        for act in ("int8", "int8x2"):
            alone = torch.cat([apply.run(x[m:m + 1], qw, b, kernels.ISA_AVX2, act) for m in range(rows)])
            _close(alone, _reference(x, reference.dequantize(qw), b), tol=0.05)  # (a wrong kernel fails here)
            for m in (2, 3, 4, 6, 9):
                got = apply.run(x[:m], qw, b, kernels.ISA_AVX2, act)
                assert torch.equal(got, alone[:m]), (layouts.of(qw).name, act, m)


@needs_kernels
def test_quant_linear_tiles_int4_g32_only(monkeypatch) -> None:
    """QuantLinear re-lays int4-g32 weights into tiles at load (HEARTH_INT4_TILES), other formats stay plain (VNNI
    panels off: test_quant_panels covers them)."""
    _no_quant_panels(monkeypatch)
    g = torch.Generator().manual_seed(5)
    w = torch.randn(64, 256, generator=g)
    x = torch.randn(1, 256, generator=g)
    for scheme, tiled in (("int4-g32", envs.int4_tiles()), ("int4-g64", False), ("int8", False)):
        lin = QuantLinear(256, 64, scheme=scheme)
        lin.load_shard("weight", None, w)
        assert lin.qweight.tiled == tiled and lin.weight.data_ptr() == lin.qweight.data.data_ptr()
        plain = relayout.untile_rows4(lin.qweight)
        assert torch.equal(lin(x), apply.linear(x, plain))


@pytest.mark.parametrize("N,K", [(8, 256), (36, 768), (64, 2048)])
def test_q6_tiles_are_exact(N: int, K: int) -> None:
    """GGUF Q6_K in 6-bit tiles (the LM head's decode format): 210 bytes per 256 weights like the file, the same
    floats as gguf's dequantize, and every kernel path bit-identical to the int8 group-16 repack (the AVX-512 tile
    kernel: up to fp32 summation order)."""
    gb = GGUFBlocks(int(Q.Q6_K), (N, K), torch.from_numpy(np.ascontiguousarray(_k_blocks(Q.Q6_K, N, K, seed=N))))
    t, plain = gguf_w.repack_q6_tiles(gb), gb.repack()
    assert t.bits == 6 and t.tiled and layouts.of(t).code == 4 and t.shape == (N, K) and t.nbytes() == N * K // 256 * 210
    back = relayout.untile_rows4(t)
    assert torch.equal(back.data, plain.data) and torch.equal(back.scales, plain.scales)
    assert torch.equal(reference.dequantize(t), gb.dequantize())
    if qkernels.available():
        _assert_same_results(t, plain, torch.Generator().manual_seed(K), zmm_order=True)
    with pytest.raises(ValueError, match="repack_q6_tiles"):
        gguf_w.repack_q6_tiles(GGUFBlocks(int(Q.Q6_K), (N - 1, K), gb.data[:N - 1]))


def test_gguf_q6k_head_is_kept_in_6bit_tiles() -> None:

    gb = GGUFBlocks(int(Q.Q6_K), (64, 512), torch.from_numpy(np.ascontiguousarray(_k_blocks(Q.Q6_K, 64, 512))))
    head = prepare.head_weight(gb)
    assert (head.bits == 6) == (envs.q6_tiles() and qkernels.available())
    assert torch.equal(reference.dequantize(head), gb.dequantize())
    odd = GGUFBlocks(int(Q.Q6_K), (63, 512), gb.data[:63])  # N % 4 != 0: the int8 repack
    assert prepare.head_weight(odd).bits == 8


@needs_kernels
def test_bf16_prompt_tiles_use_bf16_gemms_where_native(monkeypatch) -> None:
    """Prompt steps past GEMM_MAX_M rows dequantize row tiles: with bf16 activations on a CPU with native bf16 GEMMs the
    tiles are rounded to bf16 (torch's bf16 GEMM), else kept fp32; both within bf16 output rounding of the dequantized
    float model, and the bf16 path the bf16-rounded weights' product."""
    g = torch.Generator().manual_seed(7)
    w = torch.randn(300, 512, generator=g) / 16
    monkeypatch.setattr(apply, "_TILE_ELEMS", 100 * 512)  # several tiles, the last one short
    for qw in (quantize.quantize_int8(w), quantize.quantize_int4(w, 32)):
        deq = reference.dequantize(qw)
        x = (torch.randn(dispatch.GEMM_MAX_M + 9, 512, generator=g)).bfloat16()
        bias = torch.randn(300, generator=g)
        with activations.prompt_rows():
            got = apply.linear(x, qw, bias)
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), F.linear(x.float(), deq, bias), rtol=2e-2, atol=2e-2)
        if apply._bf16_prefill():
            want = (torch.mm(x, deq.bfloat16().t()).float() + bias).bfloat16()
            torch.testing.assert_close(got.float(), want.float(), rtol=8e-3, atol=1e-2)  # within a bf16 step
        for flag in (True, False):  # either path, whatever this CPU has
            monkeypatch.setattr(apply, "_bf16_prefill", lambda flag=flag: flag)
            y = apply.tiled(x, qw, None)
            ref = F.linear(x.float(), deq.bfloat16().float() if flag else deq)
            torch.testing.assert_close(y, ref, rtol=1e-2, atol=1e-2)
        monkeypatch.undo()
        monkeypatch.setattr(apply, "_TILE_ELEMS", 100 * 512)


def _gemm_from(qw: packed.QWeight) -> int:
    return dispatch.gemm_from(layouts.of(qw), dispatch.caps())


def _no_quant_panels(monkeypatch) -> None:
    """HEARTH_QUANT_PANELS=0 for this test: quantized weights stay in rows (or tiles)."""
    off = dataclasses.replace(dispatch.caps(), quant_panels=False)
    monkeypatch.setattr(dispatch, "caps", lambda: off)
