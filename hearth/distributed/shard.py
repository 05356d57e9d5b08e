"""Megatron-style sharding of a loaded model in place, for one rank of a tensor-parallel group.

Column-parallel: qkv_proj keeps this rank's query and KV heads, gate_up_proj its slice of the intermediate rows.
Row-parallel: o_proj and down_proj keep the matching input columns and all-reduce their partial sums (the bias on
rank 0 only). MoE: each rank keeps every world-th expert and all-reduces the weighted sum. Embedding, norms, router
and LM head stay whole (every rank computes the same hidden state between layers). A layer this does not know is
an error naming it, never a silently wrong shard.

Quantized layers (GGUF blocks, pre-quantized checkpoints, --quantization int8/int4) are cut as they load, from their
source tensors before packing (Sharder.before_load, hearth.weights.split); dense ones once loaded.
"""
from __future__ import annotations

import time

from collections.abc import Callable

import torch
from torch import nn

from hearth.layers.linear import Linear
from hearth.layers.mlp import GatedMLP
from hearth.layers.moe import SparseMoE
from hearth.layers.qkv_attention import QKVAttention
from hearth.layers.quant_linear import QuantLinear
from hearth.weights import split


class AllReduceStats:
    """Time spent in all-reduce (this process), for the per-step figure the tests and benchmarks report."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def reset(self) -> None:
        self.seconds, self.calls = 0.0, 0


AllReduce = Callable[[torch.Tensor], None]  # sums an fp32 tensor over the ranks, in place (shm_allreduce.py)


class RowParallel(nn.Module):
    """inner(x) on this rank's input slice, summed over the ranks."""

    def __init__(self, inner: nn.Module, reduce: AllReduce, stats: AllReduceStats, widen: bool = True) -> None:
        super().__init__()
        self.inner, self.reduce, self.stats, self.widen = inner, reduce, stats, widen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # NOTE: 16-bit activations go in widened (exact), so each rank's partial sum comes out in fp32 unrounded and
        # the sum is rounded once, as one rank's fp32 accumulation is.
        dtype = x.dtype
        wide = self.widen and dtype in (torch.bfloat16, torch.float16)
        y = self.inner(x.float() if wide else x).float().contiguous()
        t0 = time.perf_counter()
        self.reduce(y)
        self.stats.seconds += time.perf_counter() - t0
        self.stats.calls += 1
        return y.to(dtype)


def _rows(lin: Linear, keep: tuple[tuple[int, int], ...], shard_sizes: dict[str, int] | None) -> None:
    """Keep the given (start, size) output row ranges of a layer, in order (a quantized layer's weight was cut as
    it loaded: only its shape, shards and bias follow)."""
    if not isinstance(lin, QuantLinear):
        blocks = lin.row_blocks()
        merged = torch.cat(blocks) if len(blocks) > 1 else blocks[0]  # [out, in]
        lin.weight = nn.Parameter(split.dense_rows(merged, keep).contiguous(), requires_grad=False)
        lin.parts = None
    lin.out_features = sum(n for _, n in keep)
    if lin.bias is not None:
        lin.bias = nn.Parameter(split.dense_rows(lin.bias.data, keep).contiguous(), requires_grad=False)
    lin.shards = {}
    offset = 0
    for name, size in (shard_sizes or {}).items():
        lin.shards[name] = (offset, size)
        offset += size


def _cols(lin: Linear, start: int, size: int, rank: int) -> None:
    if not isinstance(lin, QuantLinear):
        blocks = lin.row_blocks()
        merged = torch.cat(blocks) if len(blocks) > 1 else blocks[0]
        lin.weight = nn.Parameter(merged[:, start:start + size].contiguous(), requires_grad=False)
        lin.parts = None
    lin.in_features = size
    if lin.bias is not None and rank != 0:
        lin.bias = None  # NOTE: added once, after the sum, by rank 0


def _drop(lin: Linear) -> None:
    lin.weight = nn.Parameter(torch.empty(0, lin.in_features, dtype=lin.weight.dtype), requires_grad=False)
    lin.parts = None
    if isinstance(lin, QuantLinear):
        lin.qweight = lin.scales = lin.mins = None


def _split(n: int, world: int, what: str) -> int:
    if n % world:
        raise ValueError(f"--tensor-parallel-size {world} must divide the model's {what} ({n})")
    return n // world


def plan(model: nn.Module, rank: int, world: int) -> dict[str, split.Slice]:
    """Each split linear layer's slice for `rank`, by module name, from the model's shape alone (no weights read):
    qkv and gate_up keep rows, o_proj and down_proj columns, another rank's expert nothing. Raises ValueError on a
    layer the sharding does not cover."""
    out: dict[str, split.Slice] = {}
    experts: set[str] = set()
    for name, m in model.named_modules():
        if isinstance(m, QKVAttention):
            if m.q_norm is not None and not m.per_head_norm:
                raise ValueError(f"tensor parallelism does not cover {name}: its q/k norm spans all heads")
            if m.attn.alibi_slopes is not None:
                raise ValueError(f"tensor parallelism does not cover {name}: ALiBi attention")
            h, kv, d = (_split(m.num_heads, world, "attention heads"),
                        _split(m.num_kv_heads, world, "KV heads"), m.head_dim)
            q_total, kv_total = m.q_size, m.kv_size
            out[f"{name}.qkv_proj"] = split.Slice(f"{name}.qkv_proj", rows=(
                (rank * h * d, h * d), (q_total + rank * kv * d, kv * d), (q_total + kv_total + rank * kv * d, kv * d)))
            out[f"{name}.o_proj"] = split.Slice(f"{name}.o_proj", cols=(rank * h * d, h * d))
        elif isinstance(m, SparseMoE):
            for e in range(len(m.experts)):
                experts.add(f"{name}.experts.{e}")
                if e % world != rank:  # another rank's: dropped (every rank routes alike and runs its own)
                    for proj in ("gate_up_proj", "down_proj"):
                        out[f"{name}.experts.{e}.{proj}"] = split.Slice(f"{name}.experts.{e}.{proj}")
        elif isinstance(m, GatedMLP) and name not in experts:
            full = m.gate_up_proj.out_features // 2
            inter = _split(full, world, "intermediate size")
            out[f"{name}.gate_up_proj"] = split.Slice(f"{name}.gate_up_proj", rows=(
                (rank * inter, inter), (full + rank * inter, inter)))
            out[f"{name}.down_proj"] = split.Slice(f"{name}.down_proj", cols=(rank * inter, inter))
    return out


class Sharder:
    """One rank's sharding, in two steps around the weights' loading: `before_load` gives each quantized layer its
    slice, cut from the source tensors before they are packed (so each rank packs, re-lays and holds only its part);
    calling it on the loaded model cuts the dense layers and splits the heads, MLPs and experts."""

    def __init__(self, rank: int, world: int, reduce: AllReduce) -> None:
        self.rank, self.world, self.reduce = rank, world, reduce
        self.stats = AllReduceStats()

    def before_load(self, model: nn.Module) -> None:
        for name, s in plan(model, self.rank, self.world).items():
            lin = model.get_submodule(name)
            if isinstance(lin, QuantLinear):
                lin.tp_slice = s

    def __call__(self, model: nn.Module) -> AllReduceStats:
        self.stats = shard_model(model, self.rank, self.world, self.reduce)
        return self.stats


def _check_layer(name: str, lin: nn.Module, want: split.Slice | None) -> Linear:
    if isinstance(lin, QuantLinear):
        if lin.tp_slice != want:
            raise ValueError(f"{name} was loaded quantized without its tensor-parallel slice (Sharder.before_load "
                             "runs before the weights load)")
        return lin
    if type(lin) is not Linear or lin.panels is not None:
        raise ValueError(f"tensor parallelism does not cover {name} ({type(lin).__name__})")
    return lin


def shard_model(model: nn.Module, rank: int, world: int, reduce: AllReduce) -> AllReduceStats:
    """Shard `model` (loaded; quantized layers already cut by Sharder.before_load) for `rank` of `world`. Returns
    its all-reduce stats."""
    slices = plan(model, rank, world)
    stats = AllReduceStats()
    handled: set[int] = set()
    for name, m in list(model.named_modules()):
        if isinstance(m, QKVAttention):
            h, kv, d = m.num_heads // world, m.num_kv_heads // world, m.head_dim
            qkv = _check_layer(f"{name}.qkv_proj", m.qkv_proj, slices[f"{name}.qkv_proj"])
            o = _check_layer(f"{name}.o_proj", m.o_proj, slices[f"{name}.o_proj"])
            _rows(qkv, slices[f"{name}.qkv_proj"].rows, {"q": h * d, "k": kv * d, "v": kv * d})
            _cols(o, *slices[f"{name}.o_proj"].cols, rank)
            m.o_proj = RowParallel(o, reduce, stats)
            m.num_heads, m.num_kv_heads, m.q_size, m.kv_size = h, kv, h * d, kv * d
            m.attn.num_heads, m.attn.num_kv_heads = h, kv
            handled.update(id(x) for x in (qkv, o))
        elif isinstance(m, SparseMoE):
            m.local_experts = [e % world == rank for e in range(len(m.experts))]
            for e, expert in enumerate(m.experts):
                for proj in ("gate_up_proj", "down_proj"):
                    lin = _check_layer(f"{name}.experts.{e}.{proj}", getattr(expert, proj),
                                       slices.get(f"{name}.experts.{e}.{proj}"))
                    handled.add(id(lin))
                    if not m.local_experts[e]:
                        _drop(lin)
            handled.add(id(m.gate))  # the router: replicated, every rank routes alike
            # (not widened: the router and experts see the activations as one rank does; the block's own fp32 sum
            # is what gets all-reduced)
            m.fp32_out = True
            parent, attr = _parent(model, name)
            setattr(parent, attr, RowParallel(m, reduce, stats, widen=False))
        elif isinstance(m, GatedMLP) and id(m.gate_up_proj) not in handled:
            gu = _check_layer(f"{name}.gate_up_proj", m.gate_up_proj, slices[f"{name}.gate_up_proj"])
            down = _check_layer(f"{name}.down_proj", m.down_proj, slices[f"{name}.down_proj"])
            inter = slices[f"{name}.gate_up_proj"].rows[0][1]
            _rows(gu, slices[f"{name}.gate_up_proj"].rows, {"gate": inter, "up": inter})
            _cols(down, *slices[f"{name}.down_proj"].cols, rank)
            m.down_proj = RowParallel(down, reduce, stats)
            handled.update(id(x) for x in (gu, down))
        elif hasattr(m, "tensor_parallel"):  # (a decoder stack)
            m.tensor_parallel = True  # NOTE: the whole-stack C decode program cannot all-reduce between layers
    head = getattr(model, "lm_head", None)
    if head is not None:
        handled.add(id(head))
    unknown = [n for n, m in model.named_modules() if isinstance(m, Linear) and id(m) not in handled]
    if unknown:
        raise ValueError(f"tensor parallelism does not cover {type(model).__name__} yet (e.g. {unknown[0]}): "
                         "models built from hearth's shared attention and MLP blocks only")
    return stats


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    path, _, attr = name.rpartition(".")
    return (model.get_submodule(path) if path else model), attr
