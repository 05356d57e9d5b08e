"""vLLM's engine arguments that mean nothing on a CPU, or something slightly different: accepted, mapped, told.

One place for both doors: EngineArgs.__post_init__ (Python: `EngineArgs(device="cpu", swap_space=2, ...)`) and the
CLI (vLLM's flags are EngineArgs fields too, marked with how they map: hearth/engine_args.py). A value hearth cannot
honour is a ValueError naming what to do; a no-op is one info line.
entrypoints/openai/serve_args.vllm_flag_mapping() lists every vLLM flag hearth takes.
"""
from __future__ import annotations

import logging
from typing import Any

from hearth import envs, log_level, quantization_config

logger = logging.getLogger("hearth")

# vLLM's --dtype names hearth computes in; float16 goes to bfloat16 as vLLM's CPU platform does (no fp16 GEMMs here).
_DTYPE_ALIASES = {"half": "float16", "fp16": "float16", "float": "float32", "fp32": "float32", "bf16": "bfloat16"}
DTYPE_CHOICES = ["auto", "bfloat16", "float16", "half", "float32", "float"]
# vLLM's fp8 KV caches: hearth's closest is int8 (per-token, per-kv-head scales; the same bytes per element).
_FP8_KV = ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")
# An unquantized KV cache in a named float type (engine/kv_dtype.py decides what this CPU and model can hold).
KV_FLOAT_DTYPES = ("float16", "bfloat16", "float32")
KV_CACHE_DTYPE_CHOICES = ["auto", "int8", *KV_FLOAT_DTYPES, *_FP8_KV]
# Field-report variables that switch nothing on a CPU-only engine: accepted, one info line each when set.
_NOOP_VARIABLES = ("VLLM_CPU_KV_CACHE", "VLLM_CPU_ONLY", "VLLM_NO_CUDA")
# vLLM quantization methods hearth refuses with a pointer to its own counterpart. Empty: bitsandbytes now loads
# (pre-quantized checkpoints, or --quantization bitsandbytes at load: hearth/loader/hf_quant.py).
_QUANT_EQUIVALENTS: dict[str, str] = {}


def quantization_equivalent(name: str | None) -> str | None:
    """The one-line message for a vLLM quantization method hearth maps to another (None: not such a method)."""
    return _QUANT_EQUIVALENTS.get(name) if isinstance(name, str) else None


def normalize(args: Any) -> None:
    """Map and check the vLLM fields of an EngineArgs in place (see the module doc)."""
    log_level.apply(args.debug, args.log_level)
    if args.quantization_config is not None:
        quantization_config.apply(args)
    if args.max_model_len is None and envs.max_model_len() is not None:
        args.max_model_len = envs.max_model_len()
        logger.info("--max-model-len %d from VLLM_CPU_MAX_MODEL_LEN / HEARTH_MAX_MODEL_LEN", args.max_model_len)
    if args.device not in ("cpu", "auto"):
        raise ValueError(f"device={args.device!r}: hearth runs on the CPU only; use device='cpu' (or leave it out)")
    if args.pipeline_parallel_size != 1:  # (--tensor-parallel-size N is hearth's own: hearth/distributed/)
        raise ValueError(f"--pipeline-parallel-size {args.pipeline_parallel_size}: hearth has no pipeline "
                         "parallelism; use --pipeline-parallel-size 1 (and --tensor-parallel-size N to split a model "
                         "over processes)")
    if isinstance(args.served_model_name, list):  # (vLLM's flag takes several names; the API uses the first)
        args.served_model_name = args.served_model_name[0] if args.served_model_name else None
    if args.task not in (None, "auto"):  # vLLM's older name for --runner
        args.runner = "generate" if args.task == "generate" else "pooling"
    args.task = None
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
    if args.disable_log_requests:
        noops.append("--disable-log-requests (hearth does not log requests)")
    if args.enable_chunked_prefill is not None:
        noops.append("--enable-chunked-prefill (prefill is always chunked by the token budget)")
    if args.distributed_executor_backend is not None:
        noops.append("--distributed-executor-backend (tensor parallelism is hearth's own processes)")
    if args.load_format != "auto":
        noops.append(f"--load-format {args.load_format} (the format is read from the files)")
    if args.num_gpu_blocks is not None:
        noops.append("--num-gpu-blocks (no GPU; the KV cache is --kv-cache-space GiB of CPU memory)")
    if args.cpu_kv_cache:
        noops.append("--cpu-kv-cache (the KV cache is always in CPU memory)")
    noops += [f"{name}={envs.get(name)} (a CPU-only engine: nothing to switch)" for name in _NOOP_VARIABLES
              if envs.get(name) is not None]
    for what in noops:
        logger.info("accepted %s", what)
    # Accepted and inert: the engine's configuration is the same as without them.
    args.disable_log_requests, args.enable_chunked_prefill = False, None
    args.distributed_executor_backend, args.load_format = None, "auto"
    args.num_gpu_blocks, args.cpu_kv_cache = None, False
    if args.trust_remote_code:
        logger.info("accepted --trust-remote-code: hearth never runs a model's own Python code; the architecture "
                    "must be one hearth implements")

