"""A merged projection loaded shard by shard keeps the checkpoint tensors themselves (no copy) and computes exactly
what one merged weight would, for decode-sized and prefill-sized inputs, with and without bias."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hearth.layers.linear import Linear
from hearth.weights import apply

SHARDS = {"q": 64, "k": 16, "v": 16}


def _loaded(dtype: torch.dtype, bias: bool, model_dtype: torch.dtype = torch.float32):
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(model_dtype)
    try:
        lin = Linear(48, sum(SHARDS.values()), bias=bias, shard_sizes=SHARDS)
    finally:
        torch.set_default_dtype(old)
    tensors = {name: torch.randn(rows, 48).to(dtype) for name, rows in SHARDS.items()}
    biases = {name: torch.randn(rows) for name, rows in SHARDS.items()}
    for name in ("v", "q", "k"):  # checkpoint order is not row order
        lin.load_shard("weight", name, tensors[name])
        if bias:
            lin.load_shard("bias", name, biases[name])
    return lin, tensors, biases


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_parts_are_the_checkpoint_tensors_and_compute_the_merged_product(dtype: torch.dtype, bias: bool) -> None:
    lin, tensors, biases = _loaded(dtype, bias)
    assert lin.parts is not None and [p.data_ptr() for p in lin.parts] == [tensors[n].data_ptr() for n in SHARDS]
    assert lin.weight.numel() == 0  # the merged weight was never allocated for real
    merged = torch.cat([tensors[n] for n in SHARDS]).float()
    merged_bias = torch.cat([biases[n] for n in SHARDS]) if bias else None
    for m in (1, 2, 3, 4, 5, 8, 16, 40):  # row-stream and tile kernels, and the prefill (F.linear) path
        x = torch.randn(m, 48)
        torch.testing.assert_close(lin(x), F.linear(x, merged, merged_bias), rtol=1e-5, atol=1e-4)


def test_parts_convert_to_the_model_dtype() -> None:
    lin, tensors, _ = _loaded(torch.float32, False, model_dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in lin.parts)


def test_wrong_shard_shape_is_named() -> None:
    lin = Linear(48, 96, shard_sizes=SHARDS)
    with pytest.raises(ValueError, match=r"shape mismatch for weight\[k\]"):
        lin.load_shard("weight", "k", torch.zeros(17, 48))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_linear_parts_kernel_equals_merged_kernel(dtype: torch.dtype) -> None:
    """Uneven parts (row counts not multiples of any tile) through the one-call kernel, x in the weight dtype."""

    torch.manual_seed(1)
    parts = [torch.randn(n, 72).to(dtype) for n in (37, 8, 100)]
    bias = torch.randn(145)
    for m in (1, 4, 7, 16):
        x = torch.randn(2, m, 72).to(dtype)  # a leading batch dimension, as the layers pass it
        ref = apply.dense_linear(x, torch.cat(parts), bias)
        # NOTE: not bit-equal: which rows a thread's row streams share shifts with the part boundaries
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(apply.dense_linear_parts(x, parts, bias).float(), ref.float(), rtol=tol, atol=tol)
