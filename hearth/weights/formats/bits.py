"""int32-packed integers, as GPTQ, AWQ and compressed-tensors store them: value j of a word in bits [b*j, b*j + b)."""
from __future__ import annotations

import torch


def unpack_cols(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 [R, C] -> int32 [R, C * 32 / bits]: element c * (32 / bits) + j is word c's value j (unsigned)."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    vals = torch.bitwise_right_shift(packed.to(torch.int32)[:, :, None], shifts) & ((1 << bits) - 1)
    return vals.reshape(packed.shape[0], -1)


def unpack_rows(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 [R, C] packed along dim 0 -> int32 [R * 32 / bits, C]."""
    return unpack_cols(packed.t(), bits).t()
