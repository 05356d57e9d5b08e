"""Every environment variable hearth reads: one table, VARIABLES, read lazily.

Each variable is declared once (its name, vLLM's alias names, a parser, the default, one line of doc); `get(name)`
reads the environment when called, never at import, so a worker's own environment and a test's setenv are seen.
The named accessors at the bottom are typed one-line wrappers for callers. vLLM's CPU names are aliases, so a vLLM
user's environment keeps working. docs/configuration.md is generated from this table (entrypoints/cli_docs.py).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Variable:
    name: str
    # (raw value, variable name) -> the typed value; a value it cannot read is a ValueError naming the variable.
    parse: Callable[[str, str], Any]
    # When unset or empty. A callable is called at read time (paths under the cache root depend on $HOME).
    default: Any
    doc: str
    aliases: tuple[str, ...] = ()
    shown_default: str | None = None  # the default as the docs print it, where it depends on the machine


_ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _yes_no(value: str) -> bool | None:
    """1/true/yes/on -> True, 0/false/no/off -> False (any case, spaces around), anything else None."""
    v = value.strip().lower()
    return True if v in _ON else False if v in _OFF else None


def _flag(value: str, name: str) -> bool:
    """A yes/no variable; anything _yes_no does not read is an error, so a typo does not silently mean the default."""
    on = _yes_no(value)
    if on is None:
        raise ValueError(f"{name} must be 1 or 0 (on / off), got {value!r}")
    return on


def _text(value: str, name: str) -> str:
    return value


def _gib(value: str, name: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number of GiB, got {value!r}") from None


def _gib_or_auto(value: str, name: str) -> float | None:
    gib = _gib(value, name)
    return gib if gib > 0 else None  # vLLM treats 0 as "choose for me"


def _threads(value: str, name: str) -> int:
    try:
        n = int(value.split(",")[0])  # (OpenMP allows a per-level list: the first level is ours)
    except ValueError:
        raise ValueError(f"{name} must be a positive integer, got {value!r}") from None
    if n < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return n


def _positive_int(value: str, name: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"{name} must be a positive integer, got {value!r}") from None
    if n < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return n


_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _log_level(value: str, name: str) -> str:
    v = value.strip().lower()
    if v not in _LOG_LEVELS:
        raise ValueError(f"{name} must be one of {', '.join(_LOG_LEVELS)} (any case), got {value!r}")
    return v


def _isa(value: str, name: str) -> str | None:
    v = value.strip().lower()
    if v == "auto":
        return None
    if v not in ("avx2", "avx512"):
        raise ValueError(f"{name} must be auto, avx2 or avx512, got {value!r}")
    return v


_QUANT_ACT = {"auto": "auto", "int8x2": "int8x2", "x2": "int8x2", "int8": "int8", "i8": "int8", "q8": "int8",
              "float": "float", "fp32": "float"}


def _quant_act(value: str, name: str) -> str:
    try:
        return _QUANT_ACT[value.strip().lower()]
    except KeyError:
        raise ValueError(f"{name} must be auto, int8x2, int8 or float, got {value!r}") from None


def _quant_gemm(value: str, name: str) -> str:
    if value.strip().lower() == "auto":
        return "auto"
    on = _yes_no(value)
    if on is None:
        raise ValueError(f"{name} must be auto, 1 or 0, got {value!r}")
    return "on" if on else "off"


def _dir_or_off(value: str, name: str) -> str | None:
    return None if _yes_no(value) is False else value


def _under_cache_root(name: str) -> Callable[[], str]:
    return lambda: os.path.join(cache_root(), "hearth", name)


VARIABLES: dict[str, Variable] = {v.name: v for v in (
    Variable("HEARTH_KVCACHE_SPACE", _gib_or_auto, None, "KV-cache space in GiB (what `--kv-cache-space` sets; "
             "unset or 0: sized from available memory).", aliases=("VLLM_CPU_KVCACHE_SPACE",)),
    Variable("HEARTH_CPU_OMP_THREADS_BIND", _text, "auto", "Core binding of the compute threads (what "
             "`--omp-threads-bind` sets): auto | nobind | a core list such as '0-3' or '0,2,4'.",
             aliases=("VLLM_CPU_OMP_THREADS_BIND",)),
    Variable("OMP_NUM_THREADS", _threads, None, "The compute threads when --threads is not given (as vLLM's CPU "
             "backend and torch take it)."),
    Variable("HEARTH_KEEP_FREED_MEMORY", _flag, True, "glibc keeps freed memory for reuse "
             "(platform.keep_freed_memory)."),
    Variable("HEARTH_API_KEY", _text, None, "The API key clients must send (what `--api-key` sets).",
             aliases=("VLLM_API_KEY",)),
    Variable("OPENAI_API_KEY", _text, None, "The key `hearth ps` sends when neither --api-key nor HEARTH_API_KEY "
             "gives one (as the openai client reads it)."),
    Variable("HEARTH_UPSTREAM_API_KEY", _text, None, "The gateway's key for its upstream (what `--upstream-api-key` "
             "sets)."),
    Variable("HEARTH_ALLOW_RUNTIME_LORA_UPDATING", _flag, False, "Serve POST /v1/load_lora_adapter and "
             "/v1/unload_lora_adapter (with --enable-lora; behind the admin key when keys are on). Off: the routes do "
             "not exist, so no client can make the server read a folder.",
             aliases=("VLLM_ALLOW_RUNTIME_LORA_UPDATING",)),
    Variable("HEARTH_KERNELS", _flag, True, "hearth's compiled C++ kernels; 0 runs torch's operators only "
             "(kernels/_build.py)."),
    Variable("HEARTH_KERNELS_ISA", _isa, None, "avx2 makes the process behave as an AVX2-only CPU (hearth's "
             "kernels, dispatch, --dtype auto, panels, and torch's kernels through ATEN_CPU_CAPABILITY / "
             "ONEDNN_MAX_CPU_ISA, set at hearth's import); unset or auto: the widest the CPU has."),
    Variable("HEARTH_DECODE_PROGRAM", _flag, True, "A decoder stack's decode steps in one C call "
             "(kernels/decoder.py)."),
    Variable("HEARTH_HUGEPAGES", _flag, True, "Quantized weights moved into 2 MiB pages after load "
             "(weights/hugepages.py)."),
    Variable("HEARTH_TOKENIZER_CACHE", _dir_or_off, _under_cache_root("tokenizers"), "Where the tokenizers "
             "transformers builds (a folder's, or from GGUF metadata) are cached: a directory, or 0/off to turn the "
             "cache off.", shown_default="$XDG_CACHE_HOME/hearth/tokenizers"),
    Variable("HEARTH_BF16_DOT", _flag, True, "bf16 activations against bf16 weights in AVX512-BF16 dot products "
             "(vdpbf16ps) where the CPU has them; 0 keeps the fp32-FMA kernel (same products, summed in another "
             "order)."),
    Variable("HEARTH_PANELS", _flag, True, "Dense bf16 weights repacked into panels where that pays "
             "(kernels/panels.py)."),
    Variable("HEARTH_QUANT_ACT", _quant_act, "auto", "How quantized kernels take x (weights/activations.py): auto "
             "(int8x2, prompt tokens int8 on VNNI panels; int8 for models of mostly 4-bit weights), int8x2, int8, "
             "float."),
    Variable("HEARTH_QUANT_GEMM", _quant_gemm, "auto", "Where quantized weights with several rows take the fp32-x "
             "GEMM (kernels/quant.py): auto (AVX-512 CPUs; with VNNI from 32 rows and in prompt steps only), on (1: "
             "from a few rows wherever AVX-512 runs), off (0: never)."),
    Variable("HEARTH_INT4_TILES", _flag, True, "int4 group-32 weights re-laid into 4-row tiles at load "
             "(weights/prepare.py)."),
    Variable("HEARTH_QUANT_PANELS", _flag, True, "Quantized projections re-laid into VNNI panels at load on "
             "AVX512-VNNI CPUs (kernels/quant.py, to_panels)."),
    Variable("HEARTH_Q6_TILES", _flag, True, "A GGUF Q6_K LM head kept in 6-bit tiles (else int8, group 16)."),
    Variable("HEARTH_QUANT_LM_HEAD", _flag, True, "--quantization int8 / int4 / bitsandbytes on an HF folder also "
             "quantizes the LM head at load, to int8 per row (models from 200M parameters; a tied head gets an int8 "
             "copy beside the bf16 embedding); 0: the head stays in the model dtype."),
    Variable("HEARTH_TP_SHM_ALLREDUCE", _flag, True, "Tensor-parallel ranks sum their partial results through "
             "shared memory (hearth/distributed/shm_allreduce.py); 0: through gloo only."),
    Variable("HEARTH_PANEL_CACHE", _dir_or_off, _under_cache_root("panels"), "Where packed panel weights are kept "
             "between runs (weights/panel_pack.py): a directory, or 0/off to pack into memory at every start.",
             shown_default="$XDG_CACHE_HOME/hearth/panels"),
    Variable("HEARTH_PANEL_CACHE_MAX_GIB", _gib, 32, "Cap in GiB on the panel cache's size on disk: packing a new "
             "checkpoint first evicts the least recently used entries beyond it, and a checkpoint whose panels "
             "alone exceed it is packed in memory instead."),
    Variable("HEARTH_LOGGING_LEVEL", _log_level, None, "hearth's log level (what `--log-level` sets): debug adds "
             "per-file `Loading weight ...` lines and the like; default info.", aliases=("VLLM_LOGGING_LEVEL",)),
    Variable("HEARTH_MAX_MODEL_LEN", _positive_int, None, "The context length when --max-model-len is not given "
             "(default: the model's).", aliases=("VLLM_CPU_MAX_MODEL_LEN",)),
    # vLLM-era switches from field reports: nothing to switch on a CPU-only engine (vllm_compat logs them).
    Variable("VLLM_CPU_KV_CACHE", _text, None, "Accepted, no effect: the KV cache is always in CPU memory."),
    Variable("VLLM_CPU_ONLY", _text, None, "Accepted, no effect: hearth always runs on the CPU."),
    Variable("VLLM_NO_CUDA", _text, None, "Accepted, no effect: hearth never uses CUDA."),
    Variable("XDG_CACHE_HOME", _text, lambda: os.path.join(os.path.expanduser("~"), ".cache"), "The root of "
             "hearth's caches: compiled kernels, tokenizers, panels (under hearth/).", shown_default="~/.cache"),
)}


def get(name: str) -> Any:
    """The variable's typed value, read from the environment now: the first of its name and aliases that is set
    and not empty, else its default."""
    var = VARIABLES[name]
    for n in (var.name, *var.aliases):
        value = os.environ.get(n)
        if value not in (None, ""):
            return var.parse(value, var.name)
    return var.default() if callable(var.default) else var.default


def kv_cache_space_gib() -> float | None:
    return get("HEARTH_KVCACHE_SPACE")


def omp_threads_bind() -> str:
    return get("HEARTH_CPU_OMP_THREADS_BIND")


def omp_num_threads() -> int | None:
    return get("OMP_NUM_THREADS")


def keep_freed_memory() -> bool:
    return get("HEARTH_KEEP_FREED_MEMORY")


def api_key() -> str | None:
    return get("HEARTH_API_KEY")


def openai_api_key() -> str | None:
    return get("OPENAI_API_KEY")


def upstream_api_key() -> str | None:
    return get("HEARTH_UPSTREAM_API_KEY")


def allow_runtime_lora_updating() -> bool:
    return get("HEARTH_ALLOW_RUNTIME_LORA_UPDATING")


def kernels_enabled() -> bool:
    return get("HEARTH_KERNELS")


def kernels_isa() -> str | None:
    return get("HEARTH_KERNELS_ISA")


def decode_program() -> bool:
    return get("HEARTH_DECODE_PROGRAM")


def hugepages() -> bool:
    return get("HEARTH_HUGEPAGES")


def tokenizer_cache_dir() -> str | None:
    return get("HEARTH_TOKENIZER_CACHE")


def bf16_dot() -> bool:
    return get("HEARTH_BF16_DOT")


def panels_enabled() -> bool:
    return get("HEARTH_PANELS")


def quant_activations() -> str:
    return get("HEARTH_QUANT_ACT")


def quant_gemm() -> str:
    return get("HEARTH_QUANT_GEMM")


def int4_tiles() -> bool:
    return get("HEARTH_INT4_TILES")


def quant_panels() -> bool:
    return get("HEARTH_QUANT_PANELS")


def q6_tiles() -> bool:
    return get("HEARTH_Q6_TILES")


def quant_lm_head() -> bool:
    return get("HEARTH_QUANT_LM_HEAD")


def tp_shm_allreduce() -> bool:
    return get("HEARTH_TP_SHM_ALLREDUCE")


def panel_cache_dir() -> str | None:
    return get("HEARTH_PANEL_CACHE")


def panel_cache_max_bytes() -> int:
    return int(max(get("HEARTH_PANEL_CACHE_MAX_GIB"), 0.0) * (1 << 30))


def logging_level() -> str | None:
    return get("HEARTH_LOGGING_LEVEL")


def max_model_len() -> int | None:
    return get("HEARTH_MAX_MODEL_LEN")


def cache_root() -> str:
    return get("XDG_CACHE_HOME")
