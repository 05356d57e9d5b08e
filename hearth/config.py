"""Engine configuration: small dataclasses, validated once in __post_init__ (EngineArgs: hearth/engine_args.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hearth.engine_args import EngineArgs  # noqa: F401 (declared apart, without torch, for the CLI; imported here)


class HFConfig(dict):
    """The model's HF-style config (from config.json, or mapped from GGUF metadata).

    Attribute access with a default of None keeps model code short: `cfg.rope_scaling`.
    """

    def __getattr__(self, name: str) -> Any:
        return self.get(name)

    def get_text_config(self) -> HFConfig:
        inner = self.get("text_config")
        return HFConfig({**self, **inner}) if isinstance(inner, dict) else self

    @property
    def head_dim_(self) -> int:
        return self.get("head_dim") or self["hidden_size"] // self["num_attention_heads"]

    @property
    def num_kv_heads_(self) -> int:
        return self.get("num_key_value_heads") or self["num_attention_heads"]


_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "half": torch.float16,
           "fp16": torch.float16, "float32": torch.float32, "float": torch.float32, "fp32": torch.float32}


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    """auto = bfloat16 where the CPU computes it natively (AVX512-BF16 or AMX), else float32."""
    if isinstance(name, torch.dtype):
        return name
    if name == "auto":
        from hearth.platform import cpu_info

        return torch.bfloat16 if cpu_info().has_native_bf16 else torch.float32
    if name not in _DTYPES:
        raise ValueError(f"--dtype must be one of auto, bfloat16, float16, float32; got {name!r}")
    return _DTYPES[name]


@dataclass
class ModelConfig:
    model: str
    hf_config: HFConfig
    architecture: str
    dtype: torch.dtype
    max_model_len: int
    eos_token_ids: list[int] = field(default_factory=list)
    bos_token_id: int | None = None
    is_gguf: bool = False
    served_model_name: str = ""

    @property
    def vocab_size(self) -> int:
        return int(self.hf_config["vocab_size"])

    @property
    def num_layers(self) -> int:
        return int(self.hf_config["num_hidden_layers"])

    @property
    def num_kv_heads(self) -> int:
        return int(self.hf_config.num_kv_heads_)

    @property
    def head_dim(self) -> int:
        return int(self.hf_config.head_dim_)


@dataclass
class CacheConfig:
    block_size: int = 16
    kv_cache_space_gib: float | None = None  # None: from available memory
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"
    num_blocks: int = 0  # decided at start-up from the space and the model's shape

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"--block-size must be a power of two, got {self.block_size}")
        if self.kv_cache_dtype not in ("auto", "int8", "float16", "bfloat16", "float32"):
            raise ValueError(f"--kv-cache-dtype must be auto, int8, float16, bfloat16 or float32, got "
                             f"{self.kv_cache_dtype!r}")
        if self.kv_cache_space_gib is not None and self.kv_cache_space_gib <= 0:
            raise ValueError(f"--kv-cache-space must be > 0 GiB, got {self.kv_cache_space_gib}")


@dataclass
class LoRAConfig:
    """--enable-lora's pool: at most max_loras distinct adapters in one step (the layers' slots), up to max_cpu_loras
    kept loaded, ranks up to max_lora_rank."""
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None  # None: max_loras

    def __post_init__(self) -> None:
        if self.max_loras < 1:
            raise ValueError(f"--max-loras must be >= 1, got {self.max_loras}")
        if self.max_lora_rank < 1:
            raise ValueError(f"--max-lora-rank must be >= 1, got {self.max_lora_rank}")
        if self.max_cpu_loras is None:
            self.max_cpu_loras = self.max_loras
        if self.max_cpu_loras < self.max_loras:
            raise ValueError(f"--max-cpu-loras ({self.max_cpu_loras}) must be at least --max-loras "
                             f"({self.max_loras})")


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    max_waiting_requests: int | None = None
    # While sequences are decoding, start at most this many new prompts per step (0: as many as the budget
    # allows). 1 staggers a burst of arrivals, so later requests wait about one step for their first token
    # instead of a whole wave's prefill, at some cost in throughput (see the scheduler).
    max_prefills_per_decode_step: int = 0
    # Sequence slots one request (all its n sequences) may hold at once; None: a quarter of max_num_seqs, so one
    # request with a large n cannot take every slot while others wait.
    max_num_seqs_per_request: int | None = None
    scheduling_policy: str = "fcfs"  # fcfs | priority (vLLM's: lower `priority` values first, then arrival)
    # --enable-lora: at most this many distinct adapters among the running requests (0: no adapters)
    max_loras: int = 0

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"--max-num-seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_seqs_per_request is None:
            self.max_num_seqs_per_request = max(1, self.max_num_seqs // 4)
        if self.max_num_seqs_per_request < 1:
            raise ValueError(f"--max-num-seqs-per-request must be >= 1, got {self.max_num_seqs_per_request}")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"--scheduling-policy must be fcfs or priority, got {self.scheduling_policy!r}")
        if self.max_prefills_per_decode_step < 0:
            raise ValueError("--max-prefills-per-decode-step must be >= 0 (0: no limit), "
                             f"got {self.max_prefills_per_decode_step}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"--max-num-batched-tokens must be >= 1, got {self.max_num_batched_tokens}")
