"""Weight-only quantized linear layers, swapped in for Linear before loading (`quantize_model`).

Schemes (EngineArgs.quantization):
  nf4           (--quantization bitsandbytes) bitsandbytes' NF4, blocks of 64 (hearth.weights.formats.bitsandbytes)
  int8          symmetric per-output-channel int8, computed at load from float checkpoint weights
  int4          asymmetric group-wise int4 (scale + min per group), group 128 (int4-g32 / -g64 / -g128 to choose);
                a layer whose K is not a multiple of the group takes the largest of 128/64/32 that divides it
  prequant      (a checkpoint with a quantization_config: GPTQ, AWQ, compressed-tensors) the layers' packed
                tensors repacked exactly into int4 / int8 (hearth.weights.formats); layers it left in float stay dense
  gguf          (GGUF files by default, or `auto`) keep the weights of weights.gguf.KEPT_NAMES quantized, repacked
                into hearth's int8 / int4 / codebook layouts without going through floats. A layer whose shards
                arrive in other formats (F16, Q5_K, ... or a mix of layouts) is stored dense, exactly like Linear.
lm_head and the embeddings stay in the model dtype (tied heads read the embedding table); a GGUF's LM head of a kept
type is also kept in its blocks (model_loader, CausalLMBase.lm_head_qweight), and an HF folder's head quantized at
load (int8 / int4 / nf4) becomes int8 per row after loading (hearth.loader.lm_head), not a QuantLinear.

QuantLinear is a Linear (the model's loader fills it through the same `load_shard`); `weight` holds the packed
integers, `scales` / `mins` are buffers. Packing and the final layout are
hearth.weights.prepare's (pack_parts); forward is hearth.weights.apply.linear, whose kernel hearth.weights.dispatch
chooses from the layout table.
"""
from __future__ import annotations

import torch
from torch import nn

from hearth.kernels.decoder import LinearSpec
from hearth.layers.linear import Linear
from hearth.weights import apply, prepare, split
from hearth.weights.formats.source import PackedSource
from hearth.weights.gguf import GGUFBlocks
from hearth.weights.packed import QWeight, supports

SCHEMES = ("int8", "int4", "int4-g32", "int4-g64", "int4-g128", "gguf")
# Modules never quantized: their weights are read by other code (tied embeddings) or are worth their precision.
SKIP_MODULES = ("lm_head",)


def parse_scheme(name: str | None, is_gguf: bool) -> str | None:
    """The scheme for EngineArgs.quantization: None / auto -> gguf for GGUF files, none otherwise."""
    if name in (None, "auto"):
        return "gguf" if is_gguf else None
    if name == "none":
        return None
    if name not in SCHEMES:
        raise ValueError(f"--quantization must be one of auto, none, {', '.join(SCHEMES)}; got {name!r}")
    return name


def _int4_group(scheme: str, k: int) -> int | None:
    wanted = int(scheme.split("-g")[1]) if "-g" in scheme else 128
    for g in (wanted, 128, 64, 32):
        if g <= wanted and supports(k, g):
            return g
    return None


class QuantLinear(Linear):
    """Linear with weights quantized per `scheme`; same interface (load_shard, forward)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 shard_sizes: dict[str, int] | None = None, scheme: str = "int8") -> None:
        super().__init__(in_features, out_features, bias, shard_sizes)
        self.scheme = scheme
        self.qweight: QWeight | None = None  # set once every shard is in; None while dense
        self.register_buffer("scales", None, persistent=False)
        self.register_buffer("mins", None, persistent=False)
        # GPTQ act-order: the packed weight's columns are in this order, so x is gathered by it (None: as is)
        self.register_buffer("in_perm", None, persistent=False)
        # Tensor parallelism (hearth/distributed/shard.py): this rank's slice, cut before packing; None: whole.
        self.tp_slice: split.Slice | None = None
        # Shards received so far (gguf: kept until all are in, then packed together).
        self._pending: dict[str | None, torch.Tensor | GGUFBlocks | PackedSource] = {}
        # The float weight is allocated lazily (dense fallback only): quantized layers never hold it.
        self.weight = nn.Parameter(torch.empty(0, dtype=self.weight.dtype), requires_grad=False)

    @classmethod
    def from_linear(cls, lin: Linear, scheme: str) -> QuantLinear:
        sizes = {name: size for name, (_, size) in lin.shards.items()} or None
        return cls(lin.in_features, lin.out_features, lin.bias is not None, sizes, scheme)

    def load_shard(self, param: str, shard: str | None, tensor: torch.Tensor | GGUFBlocks | PackedSource) -> None:
        if param != "weight":
            return super().load_shard(param, shard, tensor)
        rows = self.shards[shard][1] if shard is not None else self.out_features
        if tuple(tensor.shape) != (rows, self.in_features):
            raise ValueError(f"shape mismatch for weight[{shard}]: checkpoint {tuple(tensor.shape)}, "
                             f"model {(rows, self.in_features)}")
        self._pending[shard] = tensor
        # A fused checkpoint tensor (Phi-3's qkv / gate_up) fills a sharded layer whole, in one call.
        if shard is None or len(self._pending) == max(1, len(self.shards)):
            self._finish()

    def _finish(self) -> None:
        order = [None] if None in self._pending else (list(self.shards) or [None])
        parts = [self._pending[name] for name in order]
        self._pending = {}
        k, tp = self.in_features, self.tp_slice
        if tp is not None and tp.drop:  # another rank's expert
            self.weight = nn.Parameter(torch.empty(0, k, dtype=self.weight.dtype), requires_grad=False)
            return
        group = None if self.scheme in ("gguf", "int8", "nf4") else _int4_group(self.scheme, k)
        in_perm = prepare.input_perm(parts)
        qw = prepare.pack_parts(parts, self.scheme, k, group) if tp is None else self._pack_slice(parts, group, in_perm)
        if qw is None:  # dense: exactly what Linear would hold
            dense = torch.cat([p.dequantize() if isinstance(p, (GGUFBlocks, PackedSource)) else p for p in parts])
            if tp is not None:
                dense = split.dense_rows(dense, tp.rows) if tp.rows else dense[:, tp.cols[0]:sum(tp.cols)]
            self.weight = nn.Parameter(torch.empty(dense.shape, dtype=self.weight.dtype), requires_grad=False)
            Linear.load_shard(self, "weight", None, dense.contiguous())
            return
        self.qweight = qw
        self.in_perm = in_perm
        self.weight = nn.Parameter(qw.data, requires_grad=False)
        self.scales, self.mins = qw.scales, qw.mins

    def _pack_slice(self, parts: list, group: int | None, in_perm: torch.Tensor | None) -> QWeight | None:
        """This rank's rows (cut from the sources) or columns (cut from the whole layer in plain rows), packed."""
        tp, k = self.tp_slice, self.in_features
        if tp.rows is not None:
            return prepare.pack_parts(split.rows(parts, tp.rows), self.scheme, k, group)
        start, size = tp.cols
        if in_perm is not None:
            raise ValueError(f"tensor parallelism cannot split {tp.name} by its inputs: GPTQ act-order (desc_act) "
                             "groups are not contiguous columns; use a desc_act=false checkpoint")
        if self.scheme.startswith("int4"):  # quantized here: groups that fall within this rank's columns
            group = _int4_group(self.scheme, size)
        qw = prepare.pack_parts(parts, self.scheme, k, group, final=False)
        return None if qw is None else prepare.relayout(split.cols(qw, start, size, tp.name))

    def program_spec(self) -> LinearSpec | None:
        if self.qweight is None:
            return super().program_spec()
        if self.in_perm is not None:
            return None  # (the decode program has no input gather: such a model runs layer by layer)
        bias = self.bias.detach().float().contiguous() if self.bias is not None else None
        return apply.program_spec(self.qweight, bias)

    def can_use_panels(self) -> bool:
        return False  # (a layer left dense keeps its rows: its forward reads the weight, not panels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.qweight is None:
            return apply.dense_linear(x, self.weight, self.bias)
        if self.in_perm is not None:
            x = x.index_select(-1, self.in_perm)
        return apply.linear(x, self.qweight, self.bias)

    def extra_repr(self) -> str:
        fmt = "dense" if self.qweight is None else f"int{self.qweight.bits} group {self.qweight.group}"
        if self.qweight is not None and self.qweight.codebook is not None:
            fmt = f"4-bit codebook, blocks of {self.qweight.group}"
        return f"in={self.in_features}, out={self.out_features}, {self.scheme}: {fmt}"


def quantize_model(model: nn.Module, scheme: str) -> int:
    """Replace every Linear (but SKIP_MODULES) by a QuantLinear of `scheme`, before loading; returns the count."""
    swaps = [(name, mod) for name, mod in model.named_modules()
             if type(mod) is Linear and name.rsplit(".", 1)[-1] not in SKIP_MODULES]
    for name, mod in swaps:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, QuantLinear.from_linear(mod, scheme))
    return len(swaps)


def quantized_bytes(model: nn.Module) -> tuple[int, int]:
    """(layers quantized, bytes of their packed weights + scales), for the load log line."""
    layers = [m for m in model.modules() if isinstance(m, QuantLinear) and m.qweight is not None]
    return len(layers), sum(m.qweight.nbytes() for m in layers)
