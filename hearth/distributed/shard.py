"""Megatron-style sharding of a loaded model in place, for one rank of a tensor-parallel group.

Column-parallel: qkv_proj keeps this rank's query and KV heads, gate_up_proj its slice of the intermediate rows.
Row-parallel: o_proj and down_proj keep the matching input columns and all-reduce their partial sums (the bias on
rank 0 only). MoE: each rank keeps every world-th expert and all-reduces the weighted sum. Embedding, norms, router
and LM head stay whole (every rank computes the same hidden state between layers). A layer this does not know is
an error naming it, never a silently wrong shard.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from hearth.layers.linear import Linear


class AllReduceStats:
    """Time spent in all-reduce (this process), for the per-step figure the tests and benchmarks report."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def reset(self) -> None:
        self.seconds, self.calls = 0.0, 0


class RowParallel(nn.Module):
    """inner(x) on this rank's input slice, summed over the group."""

    def __init__(self, inner: nn.Module, group: dist.ProcessGroup, stats: AllReduceStats, widen: bool = True) -> None:
        super().__init__()
        self.inner, self.group, self.stats, self.widen = inner, group, stats, widen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # NOTE: 16-bit activations go in widened (exact), so each rank's partial sum comes out in fp32 unrounded and
        # the sum is rounded once, as one rank's fp32 accumulation is.
        dtype = x.dtype
        wide = self.widen and dtype in (torch.bfloat16, torch.float16)
        y = self.inner(x.float() if wide else x).float().contiguous()
        t0 = time.perf_counter()
        self.group.allreduce([y]).wait()
        self.stats.seconds += time.perf_counter() - t0
        self.stats.calls += 1
        return y.to(dtype)


def _rows(lin: Linear, keep: list[tuple[int, int]], shard_sizes: dict[str, int] | None) -> None:
    """Keep the given (start, size) output row ranges of a dense layer, in order."""
    blocks = lin.row_blocks()
    merged = torch.cat(blocks) if len(blocks) > 1 else blocks[0]  # [out, in]
    parts = [merged[s:s + n].contiguous() for s, n in keep]
    lin.out_features = sum(n for _, n in keep)
    lin.weight = nn.Parameter(torch.cat(parts), requires_grad=False)
    lin.parts = None
    if lin.bias is not None:
        lin.bias = nn.Parameter(torch.cat([lin.bias.data[s:s + n] for s, n in keep]).contiguous(),
                                requires_grad=False)
    lin.shards = {}
    offset = 0
    for name, size in (shard_sizes or {}).items():
        lin.shards[name] = (offset, size)
        offset += size


def _cols(lin: Linear, start: int, size: int, rank: int) -> None:
    blocks = lin.row_blocks()
    merged = torch.cat(blocks) if len(blocks) > 1 else blocks[0]
    lin.weight = nn.Parameter(merged[:, start:start + size].contiguous(), requires_grad=False)
    lin.parts = None
    lin.in_features = size
    if lin.bias is not None and rank != 0:
        lin.bias = None  # NOTE: added once, after the sum, by rank 0


def _check_dense(name: str, lin: nn.Module) -> Linear:
    if type(lin) is not Linear or lin.panels is not None:
        raise ValueError(f"tensor parallelism needs dense weights; {name} is {type(lin).__name__}: "
                         "pass --quantization none (GGUF files are then dequantized at load)")
    return lin


def _split(n: int, world: int, what: str) -> int:
    if n % world:
        raise ValueError(f"--tensor-parallel-size {world} must divide the model's {what} ({n})")
    return n // world


def shard_model(model: nn.Module, rank: int, world: int, group: dist.ProcessGroup) -> AllReduceStats:
    """Shard `model` (loaded, not yet packed or quantized) for `rank` of `world`. Returns its all-reduce stats."""
    from hearth.models.blocks import DecoderModel, QKVAttention
    from hearth.models.llama import LlamaMLP
    from hearth.models.mixtral import SparseMoE

    stats = AllReduceStats()
    handled: set[int] = set()
    for name, m in list(model.named_modules()):
        if isinstance(m, QKVAttention):
            if m.q_norm is not None and not m.per_head_norm:
                raise ValueError(f"tensor parallelism does not cover {name}: its q/k norm spans all heads")
            if m.attn.alibi_slopes is not None:
                raise ValueError(f"tensor parallelism does not cover {name}: ALiBi attention")
            h, kv, d = (_split(m.num_heads, world, "attention heads"),
                        _split(m.num_kv_heads, world, "KV heads"), m.head_dim)
            qkv = _check_dense(f"{name}.qkv_proj", m.qkv_proj)
            q_total, kv_total = m.q_size, m.kv_size
            _rows(qkv, [(rank * h * d, h * d), (q_total + rank * kv * d, kv * d),
                        (q_total + kv_total + rank * kv * d, kv * d)], {"q": h * d, "k": kv * d, "v": kv * d})
            _cols(_check_dense(f"{name}.o_proj", m.o_proj), rank * h * d, h * d, rank)
            m.o_proj = RowParallel(m.o_proj, group, stats)
            m.num_heads, m.num_kv_heads, m.q_size, m.kv_size = h, kv, h * d, kv * d
            m.attn.num_heads, m.attn.num_kv_heads = h, kv
            handled.update(id(x) for x in (qkv, m.o_proj.inner))
        elif isinstance(m, SparseMoE):
            m.local_experts = [e % world == rank for e in range(len(m.experts))]
            for e, expert in enumerate(m.experts):
                handled.update(id(x) for x in (expert.gate_up_proj, expert.down_proj))
                if not m.local_experts[e]:  # another rank's: drop its weights
                    for lin in (expert.gate_up_proj, expert.down_proj):
                        lin.weight = nn.Parameter(torch.empty(0, lin.in_features), requires_grad=False)
                        lin.parts = None
            handled.add(id(m.gate))  # the router: replicated, every rank routes alike
            # (not widened: the router and experts see the activations as one rank does; the block's own fp32 sum
            # is what gets all-reduced)
            m.fp32_out = True
            parent, attr = _parent(model, name)
            setattr(parent, attr, RowParallel(m, group, stats, widen=False))
        elif isinstance(m, LlamaMLP) and id(m.gate_up_proj) not in handled:
            gu = _check_dense(f"{name}.gate_up_proj", m.gate_up_proj)
            inter = _split(gu.out_features // 2, world, "intermediate size")
            full = gu.out_features // 2
            _rows(gu, [(rank * inter, inter), (full + rank * inter, inter)], {"gate": inter, "up": inter})
            _cols(_check_dense(f"{name}.down_proj", m.down_proj), rank * inter, inter, rank)
            m.down_proj = RowParallel(m.down_proj, group, stats)
            handled.update(id(x) for x in (gu, m.down_proj.inner))
        elif isinstance(m, DecoderModel):
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
