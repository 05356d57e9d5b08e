"""--kv-cache-dtype -> the torch dtype the KV cache is allocated in.

The attention paths read K/V in the model's compute dtype (or int8 with scales), so a float type other than the
model's is not honoured: the cache falls back to the model dtype with one log line saying why, never an error.
bfloat16 on a CPU without native bf16 (AVX512-BF16 / AMX) falls back too, as the field reports warn for such CPUs.
"""
from __future__ import annotations

import logging

import torch

from hearth.platform import cpu_info

logger = logging.getLogger("hearth")

_FLOATS = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def kv_cache_dtype(requested: str, model_dtype: torch.dtype) -> torch.dtype:
    """requested: auto | int8 | float16 | bfloat16 | float32 (fp8 names are int8 by now: vllm_compat)."""
    if requested == "int8":
        return torch.int8
    wanted = _FLOATS.get(requested)
    if wanted is None or wanted == model_dtype:
        return model_dtype
    model = str(model_dtype).removeprefix("torch.")
    if wanted == torch.bfloat16 and not cpu_info().has_native_bf16:
        why = "this CPU has no native bf16 (AVX512-BF16 / AMX)"
    elif wanted == torch.float16:
        why = "hearth has no float16 attention on CPUs"
    else:
        why = f"the KV cache holds the model's compute dtype; --dtype {requested} gives a {requested} cache"
    logger.warning("--kv-cache-dtype %s: %s; the KV cache is %s", requested, why, model)
    return model_dtype
