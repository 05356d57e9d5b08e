"""A key's tokens_per_day, held before a request runs: each request reserves all it may use (its prompts, plus
n x max_tokens for each), is refused with a 429 when that does not fit beside what the key used today and what
its running requests hold, and gives back what it did not use when it ends. Counting only what had been used
let one request of 32 prompts x 64 tokens spend 2 080 tokens of a 50-token quota."""
from __future__ import annotations

import contextvars
import json
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from hearth.engine.protocol import EngineRequest, engine_requests
from hearth.entrypoints.openai.api_keys import KeyRing, KeyUsage, LimitExceeded, Meter, current_meter
from hearth.entrypoints.openai.errors import APIError


def tokens_needed(requests: Sequence[EngineRequest], max_model_len: int) -> int:
    """The most tokens these engine requests may use: each prompt, and n x max_tokens (no max_tokens: the context
    left after the prompt). Pooling requests use their prompt only."""
    total = 0
    for r in engine_requests(requests):
        ids, params = r.prompt_token_ids, r.params
        max_tokens = getattr(params, "max_tokens", 0)
        if max_tokens is None:
            max_tokens = max(0, max_model_len - len(ids))
        total += len(ids) + (getattr(params, "n", 1) or 1) * max_tokens
    return total


class Charge:
    """One request's hold on its key's quota. Tokens move from held to used as they are counted; close() gives
    back what is still held."""

    def __init__(self, meter: Meter, held: int) -> None:
        self.meter, self.held = meter, held
        self.prompt = self.completion = 0  # what it used

    def use(self, prompt: int, completion: int) -> None:
        m = self.meter
        self.prompt += prompt
        self.completion += completion
        m.ring.add_tokens(m.name, m.usage, prompt, completion)
        moved = min(prompt + completion, self.held)
        self.held -= moved
        m.usage.reserved -= moved

    def close(self) -> None:
        self.meter.usage.reserved -= self.held
        self.held = 0


# The charges of the HTTP request being served, when its caller wants them (the gateway: what a local answer
# used is what a cache hit of it costs).
request_charges: contextvars.ContextVar[list[Charge] | None] = contextvars.ContextVar("hearth_charges",
                                                                                       default=None)


def has_quota() -> bool:
    m = current_meter.get()
    return m is not None and m.tokens_per_day is not None


def reserve(tokens: int) -> Charge | None:
    """Hold `tokens` for the key serving this request (None: no key), or raise a 429 when they do not fit."""
    m = current_meter.get()
    if m is None:
        return None
    try:
        m.ring.hold(m.name, m.usage, m.tokens_per_day, tokens)
    except LimitExceeded as e:
        raise APIError(429, str(e), "rate_limit_error", code="rate_limit_exceeded",
                       headers={"Retry-After": str(e.retry_after)}) from None
    charge = Charge(m, tokens)
    charges = request_charges.get()
    if charges is not None:
        charges.append(charge)
    return charge


@dataclass(frozen=True)
class QuotaLeft:
    """A key's daily quota as it stood when its request left for another process (a Ray Serve replica), where
    reserve() holds the request's tokens against it as it does here (picklable)."""
    name: str
    tokens_per_day: int
    at: float  # the sender's wall-clock time: the receiver counts in the sender's day, whatever its own clock says
    spent: int  # tokens of that day used, plus held by the key's running requests


def quota_left() -> QuotaLeft | None:
    """The quota of the key serving this request (None: no key, or no tokens_per_day)."""
    m = current_meter.get()
    if m is None or m.tokens_per_day is None:
        return None
    at, spent = m.ring.spent_today(m.usage)
    return QuotaLeft(m.name, m.tokens_per_day, at, spent)


class _ReportingRing(KeyRing):
    """A KeyRing that tells `held` of each hold it grants (the sender holds as much on its own ring)."""

    def __init__(self, at: float, held: Callable[[int], None]) -> None:
        super().__init__([], wall=lambda: at)
        self.held = held

    def hold(self, name: str, u: KeyUsage, quota: int | None, tokens: int) -> None:
        super().hold(name, u, quota, tokens)
        self.held(tokens)


def remote_meter(quota: QuotaLeft | None, held: Callable[[int], None] | None = None) -> Meter:
    """The meter a request runs under in the process it was sent to: it counts what the request uses (for the
    sender to charge), and with a quota, reserve() refuses what does not fit in what was left and tells `held`
    what it holds."""
    if quota is None:
        return Meter(KeyRing([]), "remote", KeyUsage())
    ring = _ReportingRing(quota.at, held or (lambda tokens: None))
    return Meter(ring, quota.name, KeyUsage(day=int(quota.at // 86400), day_tokens=quota.spent), quota.tokens_per_day)


def charge_now(prompt: int, completion: int) -> None:
    """Charge tokens used elsewhere (a cached answer's, again) to the request's key: a 429 when they do not fit."""
    charge = reserve(prompt + completion)
    if charge is not None:
        charge.use(prompt, completion)
        charge.close()


def usage_of(body: bytes) -> tuple[int, int] | None:
    """(prompt, completion) tokens from the last OpenAI `usage` in a JSON body or an SSE stream (a stream has one
    only with stream_options.include_usage); None without one."""
    lines = [body] if not body.lstrip().startswith(b"data:") else reversed(body.split(b"\n"))
    for line in lines:
        text = line.strip().removeprefix(b"data:").strip()
        if not text.startswith(b"{") or b'"usage"' not in text:
            continue
        try:
            usage = json.loads(text).get("usage")
        except (ValueError, RecursionError):
            continue
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            return usage["prompt_tokens"], int(usage.get("completion_tokens") or 0)
    return None


async def settled(chunks: AsyncIterator[bytes | str], charge: Charge) -> AsyncIterator[bytes]:
    """A forwarded stream that charges its reported usage when it ends, or all it held when it reports none."""
    parts: list[bytes] = []
    try:
        async for chunk in chunks:
            data = chunk.encode() if isinstance(chunk, str) else chunk
            parts.append(data)
            yield data
    finally:
        settle(charge, b"".join(parts))


def settle(charge: Charge | None, body: bytes) -> None:
    if charge is None:
        return
    used = usage_of(body)
    charge.use(*(used if used is not None else (charge.held, 0)))
    charge.close()


class MeteredStream:
    """A RequestStream that charges the completion tokens it yields to its request's key, and closes the charge
    when it ends (or, never iterated, when it is dropped)."""

    def __init__(self, stream, charge: Charge) -> None:
        self._stream, self._charge = stream, charge
        weakref.finalize(self, charge.close)  # (close is idempotent: held is 0 after the first)

    def __aiter__(self) -> AsyncIterator:
        return self._iter()

    async def _iter(self) -> AsyncIterator:
        try:
            async for out in self._stream:
                self._charge.use(0, len(out.new_token_ids))
                yield out
        finally:
            self._charge.close()

    def __getattr__(self, name: str):  # abort(), aborted, finished, request_ids: the stream's own
        return getattr(self._stream, name)


def meter(stream, requests: Sequence[EngineRequest], charge: Charge | None):
    """Wrap a new RequestStream for the key serving this request (prompt tokens count at once); no key: as is."""
    if charge is None:
        return stream
    charge.use(sum(len(r.prompt_token_ids) for r in engine_requests(requests)), 0)
    return MeteredStream(stream, charge)
