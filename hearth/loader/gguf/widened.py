"""The GGUF block types a load widens (no kernel keeps them quantized) and the memory that costs, from the tensor
headers alone: the load's log line and `hearth doctor MODEL` read the same numbers."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hearth.loader.gguf.checkpoint import GGUFCheckpoint, kept_as_blocks, storage_dtype
from hearth.loader.gguf.reader import TORCH_FLOAT, TYPES


@dataclass(frozen=True)
class WidenedType:
    """One ggml type's widened tensors: how many, their bytes in the file and once widened in memory."""

    name: str
    tensors: int
    file_bytes: int
    memory_bytes: int
    dtype: torch.dtype  # what most of them become (float16 matrices in a float32 model, else the model dtype)

    @property
    def extra_bytes(self) -> int:
        return self.memory_bytes - self.file_bytes


def widened_types(ckpt: GGUFCheckpoint, keep: frozenset[str], dtype: torch.dtype) -> list[WidenedType]:
    """Per block type, the tensors a model in `dtype` dequantizes at load with `keep` the types kept in their blocks
    (weights.gguf.KEPT_NAMES, or none with --quantization none), largest cost first. Float types (F32 / F16 / BF16)
    are not block types and never count."""
    tally: dict[str, list] = {}
    for hf, info in ckpt.tensor_infos():
        if info.ggml_type in TORCH_FLOAT or kept_as_blocks(hf, info, keep):
            continue
        out = storage_dtype(dtype, info, "embed_tokens" not in hf)
        numel = 1
        for d in info.shape:
            numel *= d
        row = tally.setdefault(TYPES[info.ggml_type][0], [0, 0, 0, {}])
        row[0] += 1
        row[1] += info.nbytes
        row[2] += numel * out.itemsize
        row[3][out] = row[3].get(out, 0) + numel
    rows = [WidenedType(name, n, fb, mb, max(dts, key=dts.get)) for name, (n, fb, mb, dts) in tally.items()]
    return sorted(rows, key=lambda r: -r.extra_bytes)


def describe(rows: list[WidenedType]) -> str:
    """One line: each widened type with its tensor count, and the memory they take beyond their file bytes."""
    mib = 1 << 20
    types = ", ".join(f"{r.name} ({r.tensors} tensors, to {str(r.dtype).removeprefix('torch.')})" for r in rows)
    extra = sum(r.extra_bytes for r in rows)
    return (f"{types}: {sum(r.memory_bytes for r in rows) / mib:.1f} MiB in memory for "
            f"{sum(r.file_bytes for r in rows) / mib:.1f} MiB in the file (+{extra / mib:.1f} MiB)")
