"""bf16 weights in 32-row panels: the kernel equals F.linear on awkward shapes, layers switch to panels without
changing results, and a model's panels are packed once into the cache file and mapped from it afterwards."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from hearth.kernels import panels, weight
from hearth.weights import apply, dispatch

pytestmark = pytest.mark.skipif(not panels.supported(), reason="panels need AVX-512 (and AVX512-BF16 where bf16 "
                                                                 "GEMMs are native)")
DOT = panels.layout() == "dot"  # pair panels read with vdpbf16ps: x rounded to bf16, K even


def _packed(w: torch.Tensor) -> torch.Tensor:
    return panels.pack(w, torch.empty(panels.numel(*w.shape), dtype=torch.bfloat16))


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k, rows", [(83, (37, 8, 100, 70)), (82, (37, 8, 100, 70)), (1100, (600,)), (2100, (70,))])
def test_kernel_equals_f_linear_on_uneven_shapes(x_dtype: torch.dtype, k: int, rows: tuple[int, ...]) -> None:
    """Rows not a multiple of 32 (masked tails), parts with an odd panel count (a panel pair and a lone panel),
    K not a multiple of 16 (the packer's scalar tail) or of the GEMM's K block, a bias, and M across the one-tile
    kernel (< 4 rows), the blocked GEMM's row tiles and tails (threads split the row tiles for few panel pairs, the
    pairs for many), and the long-prefill path (> TILED_MAX_M rows). The dot layout: even K only, and x as bf16;
    bf16 x gets bf16 written by the tiles (K = 2100: over two K blocks), exactly the fp32 result rounded."""
    if not panels.packable(1, k):
        pytest.skip("the dot layout pairs k values: even K only")
    torch.manual_seed(0)
    parts = [torch.randn(n, k).bfloat16() for n in rows]
    n_out = sum(rows)
    bias = torch.randn(n_out)
    ref_w = torch.cat(parts).float()
    packed = [_packed(p) for p in parts]
    for m in (1, 2, 3, 4, 5, 7, 8, 13, 16, 64, 150, dispatch.DENSE_PANEL_MAX_ROWS + 3):
        x = torch.randn(m, k).to(x_dtype)
        y = apply.dense_panels_linear(x, packed, list(rows), bias)
        assert y.dtype == x_dtype and y.shape == (m, n_out)
        ref = F.linear((x.bfloat16() if DOT else x).float(), ref_w, bias)
        tol = 1e-4 * (k / 83) ** 0.5 if x_dtype == torch.float32 else 3e-2 * ref.abs().max().item()
        torch.testing.assert_close(y.float(), ref, rtol=0, atol=tol, msg=f"m={m}")
        # (AMX CPUs' long prompts: torch's bf16 GEMM rounds its own sums, so the fp32 x path's numbers differ there)
        amx = dispatch.plan(apply.dense_panels_layout(), m, dispatch.caps()) is dispatch.Kernel.AMX_ROWS
        if DOT and x_dtype == torch.bfloat16 and not amx:
            assert torch.equal(y, apply.dense_panels_linear(x.float(), packed, list(rows), bias).bfloat16()), f"m={m}"
            # rows read where they lie at a wider stride, and (odd offset: not 4-byte aligned) packed first
            for off in (2, 1):
                wide = torch.zeros(m, k + 4, dtype=x_dtype)
                wide[:, off:off + k] = x
                assert torch.equal(apply.dense_panels_linear(wide[:, off:off + k], packed, list(rows), bias), y), f"m={m} {off}"


def test_pack_layout_and_widen_are_exact() -> None:
    """Panel p holds rows 32p .. 32p + 31 at every k (fma: rows 32p + i and 32p + 16 + i share lane i; dot: at
    each k pair, lane i of half h holds row 32p + 16h + i's two values), zeros past N; gathering a row gives it back,
    and (fma) widening gives back W^T exactly."""
    torch.manual_seed(1)
    w = torch.randn(45, 40).bfloat16()
    p = _packed(w)
    assert p.shape == (2, 40, 32)
    for n in range(45):
        assert torch.equal(panels.gather_rows(p, torch.tensor([n]))[0], w[n])
    if DOT:
        pairs = p.view(2, 20, 2, 16, 2)
        for n in (0, 15, 16, 31, 32, 44):
            assert torch.equal(pairs[n // 32, :, n % 32 // 16, n % 16, :].reshape(40), w[n])
        assert not pairs[1, :, 0, 13:, :].float().any() and not pairs[1, :, 1].float().any()
        return
    for n in range(45):
        assert torch.equal(p[n // 32, :, panels.lane(torch.tensor(n % 32))], w[n])
    assert not p[1, :, panels.lane(torch.arange(13, 32))].float().any()
    assert torch.equal(panels.widen([p], [45]), w.float().t())


def test_linear_and_tied_embedding_switch_to_panels_without_changing_results() -> None:
    from hearth.layers.embedding import Embedding
    from hearth.layers.linear import Linear

    torch.manual_seed(2)
    lin = Linear(48, 96, shard_sizes={"q": 64, "k": 16, "v": 16})
    for name, rows in (("q", 64), ("k", 16), ("v", 16)):
        lin.load_shard("weight", name, torch.randn(rows, 48).bfloat16())
    emb = Embedding(70, 48)
    emb.load(torch.randn(70, 48).bfloat16())
    xs = [torch.randn(m, 48).to(torch.bfloat16 if DOT else torch.float32) for m in (1, 8, 100)]
    ids = torch.tensor([[0, 31, 32, 69], [5, 16, 48, 47]])
    before = [lin(x) for x in xs] + [emb(ids)]
    buf = torch.empty(4 * 48 * 32 + 3 * 48 * 32, dtype=torch.bfloat16)
    used = 0

    def alloc(n: int) -> torch.Tensor:
        nonlocal used
        used += n
        return buf[used - n:used]

    replaced = lin.use_panels(alloc) + emb.use_panels(alloc)
    assert len(replaced) == 4 and lin.parts is None and lin.weight.numel() == 0 and emb.weight.numel() == 0
    after = [lin(x) for x in xs] + [emb(ids)]
    for a, b in zip(before, after):  # (dot: bf16 outputs, rounded from fp32 sums taken in another order)
        torch.testing.assert_close(a, b, rtol=1e-2 if DOT else 1e-5, atol=1e-2 if DOT else 1e-4)
    assert torch.equal(before[-1], after[-1])  # lookups are exact


def test_model_panels_are_cached_then_mapped_and_match_row_major(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """First load packs into the cache file, the second maps it without packing; greedy tokens equal the
    row-major run's (a tied-head llama: the embedding table is packed too)."""
    from hearth import LLM, SamplingParams
    from tests.tiny_models import build_checkpoint, tiny_config

    folder = build_checkpoint(str(tmp_path / "ckpt"), tiny_config("llama", tie_word_embeddings=True),
                              dtype=torch.bfloat16)
    cache = tmp_path / "panels"
    monkeypatch.setenv("HEARTH_PANEL_CACHE", str(cache))
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    dtype = "bfloat16" if DOT else "float32"  # (the dot layout takes bf16 models only)
    prompts = [{"prompt_token_ids": list(range(3 + i, 40 + 5 * i))} for i in range(6)]

    def run() -> list[list[int]]:
        llm = LLM(folder, dtype=dtype, kv_cache_space=0.05, max_num_batched_tokens=256)
        model = llm.engine.model
        assert model.model.embed_tokens.panels is not None
        assert model.model.layers[0].mlp.gate_up_proj.panels is not None
        out = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        del llm
        return out

    first = run()
    files = os.listdir(cache)
    assert len(files) == 1 and files[0].endswith(".bin")
    calls = []
    monkeypatch.setattr(panels, "pack", lambda *a: calls.append(a))
    assert run() == first and not calls  # mapped, not packed
    monkeypatch.undo()
    monkeypatch.setenv("HEARTH_PANELS", "0")
    llm = LLM(folder, dtype=dtype, kv_cache_space=0.05, max_num_batched_tokens=256)
    assert llm.engine.model.model.layers[0].mlp.gate_up_proj.panels is None
    row_major = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert row_major == first


@pytest.mark.skipif(panels._cpu_layout() is None, reason="no AVX-512 panel kernels here")
def test_fma_layout_kernels_run_on_any_avx512_cpu() -> None:
    """The fma layout's packer and GEMM (csrc/panel.cpp) are checked wherever AVX-512 runs, even on a CPU whose own
    layout is the dot one (its kernels then serve no model here, but the shared loop and transpose still must
    hold): uneven rows and parts, a bias, M from 1 to past the tile height."""
    from hearth import kernels

    torch.manual_seed(3)
    k, rows = 83, [37, 70]
    parts = [torch.randn(n, k).bfloat16() for n in rows]
    bias = torch.randn(sum(rows))
    packed = []
    for p in parts:
        out = torch.empty(panels.numel(*p.shape), dtype=torch.bfloat16)
        panels._lib().hk_pack_panels(p.data_ptr(), p.shape[0], k, p.stride(0), out.data_ptr(), 2)
        packed.append(out)
    ref_w = torch.cat(parts).float()
    for m in (1, 3, 4, 7, 13, 64):
        x = torch.randn(m, k)
        y = kernels.run_linear_parts(x, weight.dense(packed, 3, rows, k=k), bias)
        torch.testing.assert_close(y, F.linear(x, ref_w, bias), rtol=0, atol=1e-4, msg=f"m={m}")
