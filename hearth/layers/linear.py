"""Linear layers. The layer owns its weight format; models never branch on quantization.

Merged projections (qkv, gate_up) have output rows split into named shards, one per checkpoint tensor. A dense
layer keeps each shard's checkpoint tensor as it arrives (`parts`: for safetensors a view of the file's mapping)
instead of copying the shards into one merged weight: the copy faults in fresh memory (slow in VMs whose host
backs guest pages lazily) and doubles the weights' resident memory while it runs. The kernels take the parts in
one call (hk_linear on the parts' descriptor: one parallel region over every part's rows), as fast as a merged weight.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from hearth import kernels
from hearth.kernels import panels
from hearth.kernels.decoder import LinearSpec
from hearth.kernels.weight import DTYPE_CODE
from hearth.weights import apply, dispatch
from hearth.weights.layouts import of_dense

# 16-bit checkpoint weights (kernels.LOSSLESS_16BIT) widen to float32 exactly, so a float32 model may keep them in
# 16 bits: the same numbers, half the bytes read per decode step. Only where the kernels that read them can run.


def keep_16bit(param: torch.Tensor, tensor: torch.Tensor) -> bool:
    return param.dtype == torch.float32 and tensor.dtype in kernels.LOSSLESS_16BIT and kernels.available()


def adoptable(param: torch.Tensor, tensor: torch.Tensor) -> bool:
    """A whole checkpoint tensor in the parameter's dtype and shape becomes the parameter itself, no copy: a
    safetensors tensor is a view of the file's (private, copy-on-write) mapping, so loading reads the page cache
    instead of faulting in and filling a second copy (start-up time and peak RSS)."""
    return (tensor.dtype == param.dtype and tuple(tensor.shape) == tuple(param.shape) and tensor.is_contiguous()
            and tensor.device.type == "cpu" and not tensor.requires_grad)


class Linear(nn.Module):
    """y = x W^T (+ b), W: [out_features, in_features] in the compute dtype."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 shard_sizes: dict[str, int] | None = None) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(out_features), requires_grad=False) if bias else None
        # shard name -> (row offset, rows). Only merged layers have shards.
        self.shards: dict[str, tuple[int, int]] = {}
        # The shards' weights as loaded (rows in shard order), once every shard is in; None: one merged weight.
        self.parts: list[torch.Tensor] | None = None
        self._arrived: dict[str, torch.Tensor] = {}
        # The weight in bf16 panels (hearth.kernels.panels), one per part, and each part's rows; None: as loaded.
        self.panels: list[torch.Tensor] | None = None
        self.panel_rows: list[int] = []
        offset = 0
        for name, size in (shard_sizes or {}).items():
            self.shards[name] = (offset, size)
            offset += size
        if shard_sizes and offset != out_features:
            raise ValueError(f"shard sizes {shard_sizes} do not add up to {out_features}")

    def load_shard(self, param: str, shard: str | None, tensor: torch.Tensor) -> None:
        """Copy a checkpoint tensor into the weight or bias, or into one shard of it."""
        target = self.weight if param == "weight" else self.bias
        if target is None:
            raise ValueError(f"checkpoint has a {param} this layer does not expect")
        if param == "weight" and keep_16bit(target, tensor):
            self.weight = nn.Parameter(torch.empty(target.shape, dtype=tensor.dtype), requires_grad=False)
            target = self.weight
        if adoptable(target, tensor) and shard is None:
            setattr(self, param, nn.Parameter(tensor, requires_grad=False))
            return
        if param == "weight" and shard is not None and type(self) is Linear:
            self._add_part(shard, tensor.to(target.dtype).contiguous())
            return
        if shard is not None:
            start, size = self.shards[shard]
            target = target.data.narrow(0, start, size)
        if tuple(target.shape) != tuple(tensor.shape):
            raise ValueError(f"shape mismatch for {param}[{shard}]: checkpoint {tuple(tensor.shape)}, "
                             f"model {tuple(target.shape)}")
        target.data.copy_(tensor)

    def _add_part(self, shard: str, tensor: torch.Tensor) -> None:
        start, size = self.shards[shard]
        if tuple(tensor.shape) != (size, self.in_features):
            raise ValueError(f"shape mismatch for weight[{shard}]: checkpoint {tuple(tensor.shape)}, "
                             f"model {(size, self.in_features)}")
        self._arrived[shard] = tensor
        if len(self._arrived) == len(self.shards):
            self.parts = [self._arrived[name] for name, _ in sorted(self.shards.items(), key=lambda kv: kv[1][0])]
            self._arrived = {}
            # The merged weight was never written (never faulted in either); only its dtype is still read.
            self.weight = nn.Parameter(torch.empty(0, self.in_features, dtype=tensor.dtype), requires_grad=False)

    def row_blocks(self) -> list[torch.Tensor]:
        """The weight as loaded: its row blocks in order (the parts, or the one weight)."""
        return self.parts if self.parts is not None else [self.weight]

    def can_use_panels(self) -> bool:
        blocks = self.row_blocks()
        return (self.panels is None and all(b.dtype == torch.bfloat16 and b.dim() == 2 and panels.packable(*b.shape)
                                            and b.shape[1] == self.in_features and b.stride(1) == 1 for b in blocks))

    def use_panels(self, alloc: Callable[[int], torch.Tensor], pack: bool = True) -> list[torch.Tensor]:
        """Switch to panels: each row block's in alloc(numel) (bf16), packed there (pack=False: already there, e.g.
        a cache file of an earlier run). Returns the replaced row-major tensors."""
        blocks = self.row_blocks()
        self.panels = [panels.place(b, alloc(panels.numel(*b.shape)), pack) for b in blocks]
        self.panel_rows = [b.shape[0] for b in blocks]
        self.parts = None
        self.weight = nn.Parameter(torch.empty(0, self.in_features, dtype=torch.bfloat16), requires_grad=False)
        return blocks

    def program_spec(self) -> LinearSpec | None:
        """This projection as the decode program reads it (None: a weight the program's kernels do not take)."""
        bias = self.bias.detach().float().contiguous() if self.bias is not None else None
        if self.panels is not None:
            layout = apply.dense_panels_layout()
            return LinearSpec(0, layout.code, list(zip(self.panels, self.panel_rows)), sum(self.panel_rows),
                              self.in_features, self.in_features, bias, plan=dispatch.program_plan(layout),
                              any_rows=layout.name == "bf16-dot-panels")
        parts = self.row_blocks()
        dtypes = {w.dtype for w in parts}
        if (len(dtypes) != 1 or dtypes.pop() not in DTYPE_CODE
                or any(w.dim() != 2 or w.stride(1) != 1 or w.shape[0] == 0 for w in parts)
                or (len(parts) > 1 and not all(w.is_contiguous() for w in parts))):
            return None
        w = parts[0]
        return LinearSpec(0, DTYPE_CODE[w.dtype], [(p, p.shape[0]) for p in parts],
                          sum(p.shape[0] for p in parts), w.shape[1], w.stride(0), bias,
                          plan=dispatch.program_plan(of_dense(w.dtype)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.panels is not None:
            return apply.dense_panels_linear(x, self.panels, self.panel_rows, self.bias)
        if self.parts is None:
            return apply.dense_linear(x, self.weight, self.bias)
        return apply.dense_linear_parts(x, self.parts, self.bias)
