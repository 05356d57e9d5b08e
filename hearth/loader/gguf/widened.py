"""The GGUF block types a load widens (no kernel keeps them quantized) and the memory that costs, from the tensor
headers alone: the load's log line and `hearth doctor MODEL` read the same numbers."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hearth.loader.gguf.checkpoint import GGUFCheckpoint, kept_as_blocks, storage_dtype
from hearth.loader.gguf.reader import TORCH_FLOAT, TYPES, TensorInfo
from hearth.models.common import MERGED_PROJECTIONS
from hearth.weights import gguf


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
    are not block types and never count. A kept type counts too where its layer is merged with shards that cannot
    join it (q/k/v or gate/up of another type or kind: Q4_K_M's Q6_K attn_v beside Q4_K attn_q), since the layer
    is then loaded dense, in float32 in a float32 model (QuantLinear's fallback)."""
    groups: dict[str, list[tuple[str, TensorInfo]]] = {}
    for hf, info in ckpt.tensor_infos():
        groups.setdefault(_layer(hf), []).append((hf, info))
    tally: dict[str, list] = {}
    for members in groups.values():
        kept = [kept_as_blocks(hf, info, keep) for hf, info in members]
        kinds = {gguf.kind(TYPES[info.ggml_type][0]) for (_, info), k in zip(members, kept) if k}
        if all(kept) and len(kinds) <= 1:
            continue
        for hf, info in members:
            if info.ggml_type in TORCH_FLOAT:
                continue
            # a layer with a block shard dequantized whole is float32 (it wins the concatenation), so the model dtype
            out = dtype if any(kept) else storage_dtype(dtype, info, "embed_tokens" not in hf)
            _add(tally, TYPES[info.ggml_type][0], info, out)
    rows = [WidenedType(name, n, fb, mb, max(dts, key=dts.get)) for name, (n, fb, mb, dts) in tally.items()]
    return sorted(rows, key=lambda r: -r.extra_bytes)


def _layer(hf: str) -> str:
    """The model layer a checkpoint tensor loads into: merged projections share one (common.MERGED_PROJECTIONS)."""
    parts = hf.split(".")
    return ".".join(MERGED_PROJECTIONS[p][0] if p in MERGED_PROJECTIONS else p for p in parts)


def _add(tally: dict[str, list], name: str, info: TensorInfo, out: torch.dtype) -> None:
    numel = 1
    for d in info.shape:
        numel *= d
    row = tally.setdefault(name, [0, 0, 0, {}])
    row[0] += 1
    row[1] += info.nbytes
    row[2] += numel * out.itemsize
    row[3][out] = row[3].get(out, 0) + numel


def describe(rows: list[WidenedType]) -> str:
    """One line: each widened type with its tensor count, and the memory they take beyond their file bytes."""
    mib = 1 << 20
    types = ", ".join(f"{r.name} ({r.tensors} tensors, to {str(r.dtype).removeprefix('torch.')})" for r in rows)
    extra = sum(r.extra_bytes for r in rows)
    return (f"{types}: {sum(r.memory_bytes for r in rows) / mib:.1f} MiB in memory for "
            f"{sum(r.file_bytes for r in rows) / mib:.1f} MiB in the file (+{extra / mib:.1f} MiB)")
