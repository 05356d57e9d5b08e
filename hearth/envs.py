"""Every environment variable hearth reads, typed, in one place.

vLLM's CPU names are accepted as aliases so a vLLM user's environment keeps working.
"""
import os


def _first(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            return value
    return None


_ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _yes_no(value: str) -> bool | None:
    """1/true/yes/on -> True, 0/false/no/off -> False (any case, spaces around), anything else None."""
    v = value.strip().lower()
    return True if v in _ON else False if v in _OFF else None


def _flag(name: str, default: bool) -> bool:
    """A yes/no variable (unset or empty: default); anything _yes_no does not read is an error naming the
    variable, so a typo does not silently mean the default."""
    value = _first(name)
    if value is None:
        return default
    on = _yes_no(value)
    if on is None:
        raise ValueError(f"{name} must be 1 or 0 (on / off), got {value!r}")
    return on


def kv_cache_space_gib() -> float | None:
    """KV-cache space in GiB (HEARTH_KVCACHE_SPACE, alias VLLM_CPU_KVCACHE_SPACE); None = size automatically."""
    value = _first("HEARTH_KVCACHE_SPACE", "VLLM_CPU_KVCACHE_SPACE")
    if value is None:
        return None
    try:
        gib = float(value)
    except ValueError:
        raise ValueError(f"HEARTH_KVCACHE_SPACE must be a number of GiB, got {value!r}") from None
    return gib if gib > 0 else None  # vLLM treats 0 as "choose for me"


def omp_threads_bind() -> str:
    """auto | nobind | a core list such as '0-3' or '0,2,4'."""
    return _first("HEARTH_CPU_OMP_THREADS_BIND", "VLLM_CPU_OMP_THREADS_BIND") or "auto"


def omp_num_threads() -> int | None:
    """OMP_NUM_THREADS: the compute threads when --threads is not given (as vLLM's CPU backend and torch take it)."""
    value = _first("OMP_NUM_THREADS")
    if value is None:
        return None
    try:
        n = int(value.split(",")[0])  # (OpenMP allows a per-level list: the first level is ours)
    except ValueError:
        raise ValueError(f"OMP_NUM_THREADS must be a positive integer, got {value!r}") from None
    if n < 1:
        raise ValueError(f"OMP_NUM_THREADS must be a positive integer, got {value!r}")
    return n


def keep_freed_memory() -> bool:
    """HEARTH_KEEP_FREED_MEMORY (default on): glibc keeps freed memory for reuse (platform.keep_freed_memory)."""
    return _flag("HEARTH_KEEP_FREED_MEMORY", True)


def api_key() -> str | None:
    return _first("HEARTH_API_KEY", "VLLM_API_KEY")


def upstream_api_key() -> str | None:
    """The gateway's key for its upstream (--upstream-api-key)."""
    return _first("HEARTH_UPSTREAM_API_KEY")


def kernels_enabled() -> bool:
    """HEARTH_KERNELS (default on): hearth's compiled C++ kernels; 0 runs torch's operators only (kernels/_build.py)."""
    return _flag("HEARTH_KERNELS", True)


def kernels_isa() -> str | None:
    """HEARTH_KERNELS_ISA: avx2 makes the process behave as an AVX2-only CPU (hearth's kernels, dispatch, --dtype
    auto, panels, and torch's kernels through ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA, set at hearth's import);
    unset or auto: the widest the CPU has."""
    value = _first("HEARTH_KERNELS_ISA")
    v = None if value is None else value.strip().lower()
    if v in (None, "auto"):
        return None
    if v not in ("avx2", "avx512"):
        raise ValueError(f"HEARTH_KERNELS_ISA must be auto, avx2 or avx512, got {value!r}")
    return v


def decode_program() -> bool:
    """HEARTH_DECODE_PROGRAM (default on): a decoder stack's decode steps in one C call (kernels/decoder.py)."""
    return _flag("HEARTH_DECODE_PROGRAM", True)


def hugepages() -> bool:
    """HEARTH_HUGEPAGES (default on): quantized weights moved into 2 MiB pages after load (weights/hugepages.py)."""
    return _flag("HEARTH_HUGEPAGES", True)


def tokenizer_cache_dir() -> str | None:
    """Where the tokenizers transformers builds (a folder's, or from GGUF metadata) are cached: HEARTH_TOKENIZER_CACHE
    (a directory, or 0/off to turn the cache off), else $XDG_CACHE_HOME/hearth/tokenizers (~/.cache/hearth/...)."""
    return _cache_dir("HEARTH_TOKENIZER_CACHE", "tokenizers")


def bf16_dot() -> bool:
    """HEARTH_BF16_DOT (default on): bf16 activations against bf16 weights in AVX512-BF16 dot products (vdpbf16ps)
    where the CPU has them; 0 keeps the fp32-FMA kernel (same products, summed in another order)."""
    return _flag("HEARTH_BF16_DOT", True)


def panels_enabled() -> bool:
    """HEARTH_PANELS (default on): dense bf16 weights repacked into panels where that pays (kernels/panels.py)."""
    return _flag("HEARTH_PANELS", True)


_QUANT_ACT = {"auto": "auto", "int8x2": "int8x2", "x2": "int8x2", "int8": "int8", "i8": "int8", "q8": "int8",
              "float": "float", "fp32": "float"}


def quant_activations() -> str:
    """HEARTH_QUANT_ACT: how quantized kernels take x (kernels/quant.py): auto (default: int8x2, prompt tokens int8 on
    VNNI panels; int8 for models of mostly 4-bit weights), int8x2, int8, float."""
    value = _first("HEARTH_QUANT_ACT")
    if value is None:
        return "auto"
    try:
        return _QUANT_ACT[value.strip().lower()]
    except KeyError:
        raise ValueError(f"HEARTH_QUANT_ACT must be auto, int8x2, int8 or float, got {value!r}") from None


def quant_gemm() -> str:
    """HEARTH_QUANT_GEMM: where quantized weights with several rows take the fp32-x GEMM (kernels/quant.py):
    auto (default: AVX-512 CPUs; with VNNI from 32 rows and in prompt steps only), on (1: from a few rows wherever
    AVX-512 runs), off (0: never)."""
    value = _first("HEARTH_QUANT_GEMM")
    if value is None or value.strip().lower() == "auto":
        return "auto"
    on = _yes_no(value)
    if on is None:
        raise ValueError(f"HEARTH_QUANT_GEMM must be auto, 1 or 0, got {value!r}")
    return "on" if on else "off"


def int4_tiles() -> bool:
    """HEARTH_INT4_TILES (default on): int4 group-32 weights re-laid into 4-row tiles at load (kernels/quant.py)."""
    return _flag("HEARTH_INT4_TILES", True)


def quant_panels() -> bool:
    """HEARTH_QUANT_PANELS (default on): quantized projections re-laid into VNNI panels at load on AVX512-VNNI CPUs
    (kernels/quant.py, to_panels)."""
    return _flag("HEARTH_QUANT_PANELS", True)


def q6_tiles() -> bool:
    """HEARTH_Q6_TILES (default on): a GGUF Q6_K LM head kept in 6-bit tiles (else int8, group 16)."""
    return _flag("HEARTH_Q6_TILES", True)


def quant_lm_head() -> bool:
    """HEARTH_QUANT_LM_HEAD (default on): --quantization int8 / int4 / bitsandbytes on an HF folder also quantizes
    the LM head at load, to int8 per row (models from 200M parameters; a tied head gets an int8 copy beside the
    bf16 embedding); 0: the head stays in the model dtype."""
    return _flag("HEARTH_QUANT_LM_HEAD", True)


def tp_shm_allreduce() -> bool:
    """HEARTH_TP_SHM_ALLREDUCE (default on): tensor-parallel ranks sum their partial results through shared memory
    (hearth/distributed/shm_allreduce.py); 0: through gloo only."""
    return _flag("HEARTH_TP_SHM_ALLREDUCE", True)


def panel_cache_dir() -> str | None:
    """Where packed panel weights are kept between runs (weights/panel_pack.py): HEARTH_PANEL_CACHE (a directory,
    or 0/off: pack into memory at every start), else $XDG_CACHE_HOME/hearth/panels (~/.cache/hearth/...)."""
    return _cache_dir("HEARTH_PANEL_CACHE", "panels")


def panel_cache_max_bytes() -> int:
    """Cap on the panel cache's size on disk (HEARTH_PANEL_CACHE_MAX_GIB, default 32): packing a new checkpoint
    first evicts the least recently used entries beyond it, and a checkpoint whose panels alone exceed it is packed
    in memory instead."""
    value = _first("HEARTH_PANEL_CACHE_MAX_GIB")
    if value is None:
        return 32 << 30
    try:
        gib = float(value)
    except ValueError:
        raise ValueError(f"HEARTH_PANEL_CACHE_MAX_GIB must be a number of GiB, got {value!r}") from None
    return int(max(gib, 0.0) * (1 << 30))


def _cache_dir(variable: str, name: str) -> str | None:
    """The directory in `variable` (None if it says 0/off), else $XDG_CACHE_HOME/hearth/<name>."""
    value = _first(variable)
    if value is not None:
        return None if value.strip().lower() in ("0", "false", "no", "off") else value
    root = _first("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "hearth", name)
