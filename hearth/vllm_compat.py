"""vLLM's engine arguments that mean nothing on a CPU, or something slightly different: accepted, mapped, told.

One place for both doors: EngineArgs.__post_init__ (Python: `EngineArgs(device="cpu", swap_space=2, ...)`) and the
CLI (the flags in add_vllm_args land in the same EngineArgs fields). A value hearth cannot honour is a ValueError
naming what to do; a no-op is one info line.
"""
from __future__ import annotations

import argparse
import logging
from typing import Any

logger = logging.getLogger("hearth")

# vLLM's --dtype names hearth computes in; float16 goes to bfloat16 as vLLM's CPU platform does (no fp16 GEMMs here).
_DTYPE_ALIASES = {"half": "float16", "fp16": "float16", "float": "float32", "fp32": "float32", "bf16": "bfloat16"}
DTYPE_CHOICES = ["auto", "bfloat16", "float16", "half", "float32", "float"]
# vLLM's fp8 KV caches: hearth's closest is int8 (per-token, per-kv-head scales; the same bytes per element).
_FP8_KV = ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")
KV_CACHE_DTYPE_CHOICES = ["auto", "int8", *_FP8_KV]
# vLLM quantization methods hearth refuses with a pointer to its own counterpart. Empty: bitsandbytes now loads
# (pre-quantized checkpoints, or --quantization bitsandbytes at load: hearth/loader/hf_quant.py).
_QUANT_EQUIVALENTS: dict[str, str] = {}


def quantization_equivalent(name: str | None) -> str | None:
    """The one-line message for a vLLM quantization method hearth maps to another (None: not such a method)."""
    return _QUANT_EQUIVALENTS.get(name) if isinstance(name, str) else None


def normalize(args: Any) -> None:
    """Map and check the vLLM fields of an EngineArgs in place (see the module doc)."""
    if args.device not in ("cpu", "auto"):
        raise ValueError(f"device={args.device!r}: hearth runs on the CPU only; use device='cpu' (or leave it out)")
    if args.pipeline_parallel_size != 1:  # (--tensor-parallel-size N is hearth's own: hearth/distributed/)
        raise ValueError(f"--pipeline-parallel-size {args.pipeline_parallel_size}: hearth has no pipeline "
                         "parallelism; use --pipeline-parallel-size 1 (and --tensor-parallel-size N to split a model "
                         "over processes)")
    if args.dtype in _DTYPE_ALIASES:
        args.dtype = _DTYPE_ALIASES[args.dtype]
    if args.dtype == "float16":
        logger.warning("--dtype float16: hearth computes in bfloat16 on CPUs (as vLLM's CPU backend casts float16)")
        args.dtype = "bfloat16"
    if args.kv_cache_dtype in _FP8_KV:
        logger.warning("--kv-cache-dtype %s: no fp8 KV cache on CPUs here; using int8 (the same bytes per element, "
                       "per-token scales)", args.kv_cache_dtype)
        args.kv_cache_dtype = "int8"
    message = quantization_equivalent(args.quantization)
    if message:
        raise ValueError(message)
    noops = []
    if args.enforce_eager:
        noops.append("--enforce-eager (hearth has no CUDA graphs to skip)")
    if args.gpu_memory_utilization is not None:
        noops.append("--gpu-memory-utilization (no GPU; the KV cache is --kv-cache-space GiB / "
                     "VLLM_CPU_KVCACHE_SPACE)")
    if args.swap_space is not None:
        noops.append("--swap-space (preempted requests are recomputed, not swapped; the KV cache is "
                     "--kv-cache-space GiB)")
    if args.disable_log_stats:
        noops.append("--disable-log-stats (hearth logs no periodic stats; /metrics stays on)")
    if args.device == "cpu":
        noops.append("--device cpu (hearth always runs on the CPU)")
    for what in noops:
        logger.info("accepted %s", what)
    if args.trust_remote_code:
        logger.info("accepted --trust-remote-code: hearth never runs a model's own Python code; the architecture "
                    "must be one hearth implements")


def add_vllm_args(p: argparse.ArgumentParser) -> None:
    """vLLM's flags with no hearth meaning (or a mapped one), so a `vllm serve` line runs with the program renamed."""
    g = p.add_argument_group("vLLM compatibility", "accepted so vLLM command lines run unchanged; on a CPU most "
                                                   "mean nothing (one info line says so)")
    g.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1,
                   help="must be 1 (default: %(default)s)")
    g.add_argument("--enforce-eager", action="store_true", help="no-op: no CUDA graphs (default: off)")
    g.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="no-op: no GPU; size the KV cache with --kv-cache-space (default: %(default)s)")
    g.add_argument("--swap-space", type=float, default=None,
                   help="no-op: preemption recomputes; GiB in vLLM (default: %(default)s)")
    g.add_argument("--disable-log-stats", action="store_true", help="no-op (default: off)")
    g.add_argument("--disable-log-requests", action="store_true", help="no-op: requests are not logged (default: off)")
    g.add_argument("--device", default="auto", choices=["auto", "cpu"], help="always the CPU (default: %(default)s)")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="accepted; hearth never runs a checkpoint's Python code (default: off)")
    g.add_argument("--load-format", default="auto", help="accepted; the format is read from the files "
                                                        "(default: %(default)s)")
    g.add_argument("--enable-chunked-prefill", action="store_true", default=None,
                   help="no-op: prefill is always chunked by the token budget")
    g.add_argument("--distributed-executor-backend", default=None, help="no-op: one process")

