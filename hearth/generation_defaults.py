"""Sampling defaults for requests that leave a field unset, vLLM's way: from the checkpoint's generation_config.json.

--generation-config auto (default): the model folder's generation_config.json (the bundled model, a GGUF without
one: BUNDLED_DEFAULTS); vllm: none (SamplingParams' own defaults: temperature 1.0, no cap); FOLDER: that folder's
generation_config.json. --override-generation-config JSON goes on top (vLLM's, e.g. '{"temperature": 0.5,
"max_new_tokens": 256}'), and --max-tokens-default N caps requests that name no max_tokens.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any

logger = logging.getLogger("hearth")

# generation_config.json key -> SamplingParams field: the keys vLLM takes (ModelConfig.get_diff_sampling_param).
_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
         "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}
# The bundled SmolLM2-135M GGUF carries no generation_config. Greedy: sampled at its model card's 0.2 the first
# token of "What is the capital of France?" is "L" (-> "L'Etoile, ...") about 4 times in 10 (fp32 logprob gap
# 0.085); a cap, because a 135M model can loop to the end of its context.
BUNDLED_DEFAULTS = {"temperature": 0.0, "max_new_tokens": 1024}


def _read(folder: str) -> dict:
    path = os.path.join(folder, "generation_config.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def _parse_override(override: dict | str | None) -> dict:
    if override is None or override == "":
        return {}
    if isinstance(override, str):
        try:
            override = json.loads(override)
        except json.JSONDecodeError as e:
            raise ValueError(f"--override-generation-config must be a JSON object, like "
                             f"'{{\"max_new_tokens\": 256}}': {e}") from None
    if not isinstance(override, dict):
        raise ValueError("--override-generation-config must be a JSON object, like '{\"max_new_tokens\": 256}'")
    unknown = sorted(set(override) - set(_KEYS) - set(_KEYS.values()))
    if unknown:
        raise ValueError(f"--override-generation-config: unknown key {unknown[0]!r}; use "
                         f"{', '.join(_KEYS)}")
    return override


def resolve(mode: str, model_path: str, bundled: bool, override: dict | str | None = None,
            max_tokens_default: int | None = None) -> dict[str, Any]:
    """SamplingParams field -> default for requests that leave it unset (an empty dict: SamplingParams' own)."""
    if mode == "vllm":
        raw: dict = {}
    elif mode == "auto":
        folder = model_path if os.path.isdir(model_path) else os.path.dirname(model_path)
        raw = _read(folder) if os.path.isdir(model_path) else {}
        if not raw and bundled:
            raw = dict(BUNDLED_DEFAULTS)
    elif os.path.isdir(mode):
        raw = _read(mode)
        if not raw:
            raise ValueError(f"--generation-config {mode}: the folder has no generation_config.json")
    else:
        raise ValueError(f"--generation-config must be auto, vllm or a folder holding generation_config.json, "
                         f"got {mode!r}")
    raw = {**raw, **_parse_override(override)}
    out = {_KEYS.get(k, k): v for k, v in raw.items() if k in _KEYS or k in _KEYS.values()}
    if max_tokens_default is not None:
        if max_tokens_default < 1:
            raise ValueError(f"--max-tokens-default must be >= 1, got {max_tokens_default}")
        out["max_tokens"] = max_tokens_default
    return {k: v for k, v in out.items() if v is not None}


def describe(defaults: dict[str, Any], source: str) -> str:
    """The start-up line: what a request that sets nothing gets."""
    shown = ", ".join(f"{k}={v}" for k, v in sorted(defaults.items())) or "SamplingParams' own (temperature=1.0)"
    cap = "" if "max_tokens" in defaults else "; no max_tokens cap (--max-tokens-default N sets one)"
    return f"default sampling ({source}): {shown}{cap}"
