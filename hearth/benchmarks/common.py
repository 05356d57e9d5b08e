"""Shared pieces of `hearth bench`: seeded random prompts, percentiles, the printed table, the JSON file, and the
streaming /v1/completions client that `bench serve` and `bench lab` both drive."""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

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


# ---- the OpenAI-compatible streaming client (hearth, vLLM, llama-server)

def add_client_args(p: argparse.ArgumentParser) -> None:
    """The flags of every mode that loads a running server: where it is, how to prompt it, how to start it."""
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (a trailing /v1 is fine)")
    p.add_argument("--model", default=None, help="model name to send (default: the first of GET /v1/models)")
    p.add_argument("--prompt-mode", choices=["token-ids", "text"], default="token-ids",
                   help="send prompts as token-id lists (hearth, vLLM) or as random words (llama-server)")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer folder: draw prompt ids from its vocabulary, skipping special tokens")
    p.add_argument("--token-id-range", default="100:10000",
                   help="LOW:HIGH range of prompt token ids when no --tokenizer is given")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per request")
    p.add_argument("--api-key", default=None, help="sent as a Bearer token")
    p.add_argument("--launch", default=None, metavar="COMMAND",
                   help="start this server command first: reports seconds until /health is OK and its peak RSS "
                        "(children included), and stops it afterwards")
    p.add_argument("--launch-timeout", type=float, default=600.0, help="seconds to wait for /health")


def server_root(base_url: str) -> str:
    """http://host:port from a --base-url with or without /v1."""
    return base_url.rstrip("/").removesuffix("/v1")


def token_sampler(ns: argparse.Namespace) -> TokenSampler | None:
    """The prompt-id sampler of --tokenizer / --token-id-range; None with --prompt-mode text."""
    if ns.prompt_mode == "text":
        return None
    if ns.tokenizer:
        from hearth.tokenizer import Tokenizer

        return TokenSampler.for_tokenizer(Tokenizer.from_folder(ns.tokenizer))
    try:
        low, high = (int(x) for x in ns.token_id_range.split(":"))
    except ValueError:
        raise ValueError(f"--token-id-range must be LOW:HIGH, got {ns.token_id_range!r}") from None
    return TokenSampler(low, high)


def async_client(ns: argparse.Namespace, connections: int) -> httpx.AsyncClient:
    """One client for a whole run: --timeout per request, --api-key, enough connections for every request in flight."""
    import httpx  # here: every command imports the bench modules to build the CLI

    headers = {"Authorization": f"Bearer {ns.api_key}"} if ns.api_key else {}
    limits = httpx.Limits(max_connections=connections + 4, max_keepalive_connections=connections + 4)
    return httpx.AsyncClient(timeout=httpx.Timeout(ns.timeout, connect=30.0), limits=limits, headers=headers)


async def first_model(client: httpx.AsyncClient, root: str) -> str:
    """The model a server serves first (GET /v1/models), for runs without --model."""
    resp = await client.get(f"{root}/v1/models")
    resp.raise_for_status()
    return resp.json()["data"][0]["id"]


@dataclass
class RequestResult:
    ok: bool = False
    error: str = ""
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)  # gaps between successive chunks with choices
    output_tokens: int = 0
    prompt_tokens: int | None = None
    chunks: int = 0


def completion_payload(model: str, prompt: str | list[int], max_tokens: int) -> dict:
    """A streaming, greedy, fixed-length /v1/completions body, usage in the last chunk."""
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}


async def stream_completion(client: httpx.AsyncClient, url: str, payload: dict) -> RequestResult:
    """One streamed request, timed per chunk: TTFT is send -> first chunk with choices; output tokens are the usage
    chunk's when the server sends one (a random-weight model's tokens often decode to no text), else one per chunk."""
    import httpx

    res = RequestResult()
    t0 = time.perf_counter()
    last = t0
    try:
        async with client.stream("POST", url, json=payload) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")
                res.error = f"HTTP {resp.status_code}: {body[:300]}"
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    res.error = f"stream error: {str(chunk['error'])[:300]}"
                    return res
                now = time.perf_counter()
                if chunk.get("choices"):
                    if res.chunks == 0:
                        res.ttft_s = now - t0
                    else:
                        res.itl_s.append(now - last)
                    last = now
                    res.chunks += 1
                usage = chunk.get("usage")
                if usage:
                    res.output_tokens = usage.get("completion_tokens") or res.output_tokens
                    res.prompt_tokens = usage.get("prompt_tokens", res.prompt_tokens)
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        res.error = f"{type(e).__name__}: {e}"
        return res
    res.e2e_s = time.perf_counter() - t0
    if res.chunks == 0:
        res.error = "the stream ended without any token"
        return res
    res.output_tokens = res.output_tokens or res.chunks
    res.ok = True
    return res
