"""Long prompts on bf16 pair panels with AMX tiles: row tiles unpacked from the panels (csrc/panel_rows.cpp) for
torch's bf16 GEMM. The unpacking is exact; the linear equals F.linear on the weights in bf16; decode-sized steps
keep the panel kernel, and the decode program hands such prompts to the layer path."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from hearth.kernels import panels
from hearth.weights import apply, dispatch
from hearth.weights.layouts import PANELS_BF16_DOT

needs_dot = pytest.mark.skipif(panels.layout() != "dot", reason="the dot panel layout needs AVX512-BF16")


def _packed(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    w = (torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05).to(torch.bfloat16)
    return w, panels.pack(w, torch.empty(panels.numel(n, k), dtype=torch.bfloat16))


@needs_dot
@pytest.mark.parametrize("n,k", [(200, 96), (37, 64), (96, 30), (1100, 512)])
def test_panels_unpack_to_their_rows_exactly(n: int, k: int) -> None:
    w, p = _packed(n, k)
    assert torch.equal(panels.dot_rows(p, n, k, 0, n), w)
    for r0, r1 in ((32, min(n, 70)), (0, min(n, 32)), (n // 32 * 32 - 32 if n > 64 else 0, n)):
        assert torch.equal(panels.dot_rows(p, n, k, r0, r1), w[r0:r1]), (r0, r1)
    with pytest.raises(RuntimeError):
        panels.dot_rows(p, n, k, 5, n)  # (a tile starts on a panel)


@needs_dot
def test_amx_rows_linear_equals_f_linear(monkeypatch) -> None:
    monkeypatch.setattr(apply, "_AMX_TILE_ROWS", 64)  # several tiles per part
    monkeypatch.setattr(dispatch, "caps", lambda c=dataclasses.replace(dispatch.caps(), amx=True): c)
    (w1, p1), (w2, p2) = _packed(150, 256, 1), _packed(70, 256, 2)
    bias = torch.randn(220)
    x = torch.randn(200, 256).to(torch.bfloat16)
    assert dispatch.plan(PANELS_BF16_DOT, 200, dispatch.caps()) is dispatch.Kernel.AMX_ROWS
    got = apply.dense_panels_linear(x, [p1, p2], [150, 70], bias)
    want = F.linear(x, torch.cat([w1, w2]), bias.to(torch.bfloat16))
    assert got.dtype == torch.bfloat16 and got.shape == (200, 220)
    assert torch.equal(got, want)


def test_only_long_prompts_on_amx_cpus_leave_the_panel_kernel() -> None:
    c = dataclasses.replace(dispatch.caps(), kernels=True, avx512=True, amx=True)
    assert dispatch.plan(PANELS_BF16_DOT, dispatch.AMX_MIN_ROWS, c) is dispatch.Kernel.AMX_ROWS
    assert dispatch.plan(PANELS_BF16_DOT, dispatch.AMX_MIN_ROWS - 1, c) is dispatch.Kernel.DENSE_PANELS
    assert dispatch.program_prompt_rows(PANELS_BF16_DOT, c) == dispatch.AMX_MIN_ROWS - 1
    assert "amx-rows" not in dispatch.program_plan(PANELS_BF16_DOT, c)  # (decode steps: the program's kernels)
    no_amx = dataclasses.replace(c, amx=False)
    assert dispatch.plan(PANELS_BF16_DOT, 4096, no_amx) is dispatch.Kernel.DENSE_PANELS
    assert dispatch.program_prompt_rows(PANELS_BF16_DOT, no_amx) is None
