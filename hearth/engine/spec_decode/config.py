"""--speculative-config: vLLM's JSON shape, validated once.

    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    {"model": "/path/to/draft", "num_speculative_tokens": 4}        (method "draft_model" implied by "model")
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

_METHODS = ("ngram", "draft_model")
_KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min")
_HINT = ('e.g. --speculative-config \'{"method": "ngram", "num_speculative_tokens": 4}\' or '
         '\'{"model": "/path/to/draft", "num_speculative_tokens": 4}\'')


@dataclass
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    model: str | None = None  # draft_model: HF folder or .gguf
    prompt_lookup_max: int = 4  # ngram: longest suffix to look up
    prompt_lookup_min: int = 1  # ngram: shortest

    @classmethod
    def parse(cls, value: dict | str | SpeculativeConfig | None) -> SpeculativeConfig | None:
        """From a dict, a JSON string, or None (off). Raises ValueError with a one-line fix."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"--speculative-config is not valid JSON ({e.msg}): {_HINT}") from None
        if not isinstance(value, dict):
            raise ValueError(f"--speculative-config must be a JSON object: {_HINT}")
        unknown = sorted(set(value) - set(_KEYS))
        if unknown:
            raise ValueError(f"--speculative-config: unknown key(s) {', '.join(unknown)}; known: {', '.join(_KEYS)}")
        d: dict[str, Any] = dict(value)
        method = d.get("method") or ("draft_model" if d.get("model") else None)
        if method not in _METHODS:
            raise ValueError(f"--speculative-config: method must be one of {', '.join(_METHODS)} (or give \"model\" "
                             f"for a draft model), got {method!r}: {_HINT}")
        k = d.get("num_speculative_tokens")
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 32:
            raise ValueError(f"--speculative-config: num_speculative_tokens must be an integer in [1, 32], got {k!r}")
        if method == "draft_model" and not d.get("model"):
            raise ValueError(f"--speculative-config: method draft_model needs \"model\" (the draft's path): {_HINT}")
        if method == "ngram" and d.get("model"):
            raise ValueError("--speculative-config: method ngram takes no \"model\"; drop it or use draft_model")
        lo, hi = d.get("prompt_lookup_min"), d.get("prompt_lookup_max")
        hi = hi if hi is not None else max(4, lo or 0)
        lo = lo if lo is not None else min(1, hi)
        for name, v in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"--speculative-config: {name} must be an integer >= 1, got {v!r}")
        if lo > hi:
            raise ValueError(f"--speculative-config: prompt_lookup_min ({lo}) must not exceed prompt_lookup_max ({hi})")
        return cls(method, k, d.get("model"), hi, lo)
