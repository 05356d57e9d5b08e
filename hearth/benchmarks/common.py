"""Shared pieces of `hearth bench`: seeded random prompts, percentiles, the printed table, the JSON file."""
from __future__ import annotations

import json
import math
import random
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

# A fixed word list for text prompts (servers that do not take token ids, e.g. llama-server).
WORDS = (  # noqa: SIM905
    "time person year way day thing man world life hand part child eye woman place work week case point "
    "government company number group problem fact river stone garden window music paper letter table "
    "market city road light water fire earth cloud winter summer morning evening question answer story "
    "history science family school language memory picture station engine bridge forest mountain ocean "
    "island village kitchen doctor teacher student friend mother father brother sister animal bird horse "
    "apple bread cheese coffee orange silver golden quiet simple strong gentle bright early late ancient"
).split()


class TokenSampler:
    """Draws random token ids from [low, high), never a special or added token (seeded, reproducible)."""

    def __init__(self, low: int, high: int, excluded: Iterable[int] = ()) -> None:
        if high - low < 2:
            raise ValueError(f"need a token id range of at least 2 ids, got [{low}, {high})")
        self.low, self.high = low, high
        self.excluded = {t for t in excluded if low <= t < high}
        if len(self.excluded) >= high - low:
            raise ValueError("every token id in the range is a special token")

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, model_vocab_size: int | None = None) -> TokenSampler:
        """From a hearth Tokenizer or an HF tokenizer: ids in the smaller of the two vocabularies, no specials."""
        high = len(tokenizer)
        if model_vocab_size is not None:
            high = min(high, model_vocab_size)
        excluded = set(tokenizer.all_special_ids)
        backend = getattr(tokenizer, "backend", None)  # hearth's: a tokenizers.Tokenizer
        added = backend.get_added_tokens_decoder() if backend is not None else tokenizer.added_tokens_decoder
        excluded.update(added.keys())
        return cls(0, high, excluded)

    def sample(self, n: int, rng: random.Random) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            t = rng.randrange(self.low, self.high)
            if t not in self.excluded:
                out.append(t)
        return out


def random_prompts(sampler: TokenSampler, num: int, length: int, seed: int) -> list[list[int]]:
    """num distinct random prompts of exactly length tokens. Distinct prompts keep the prefix cache out of it."""
    rng = random.Random(seed)
    return [sampler.sample(length, rng) for _ in range(num)]


def random_text_prompts(num: int, length: int, seed: int) -> list[str]:
    """num prompts of length random words (roughly, not exactly, length tokens: the server tokenizes)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(length)) for _ in range(num)]


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default); nan for an empty list."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def print_table(title: str, rows: list[tuple[str, Any]]) -> None:
    width = max(len(k) for k, _ in rows)
    print(f"== {title} ==")
    for key, value in rows:
        print(f"{key:<{width}}  {fmt(value)}")


def print_grid(title: str, header: list[str], rows: list[list[Any]]) -> None:
    """A table with one row per run (e.g. per concurrency level)."""
    cells = [header] + [[fmt(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"== {title} ==")
    for r in cells:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))


def _clean(obj: Any) -> Any:
    """JSON has no NaN: write null instead."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def write_json(path: str, data: dict) -> None:
    with open(path, "w") as f:
        json.dump(_clean(data), f, indent=2)
        f.write("\n")
    print(f"wrote {path}")


def parse_int_list(text: str) -> list[int]:
    """'1,4,8' -> [1, 4, 8]; each >= 1."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"expected a comma-separated list of integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise ValueError(f"expected integers >= 1, got {text!r}")
    return values
