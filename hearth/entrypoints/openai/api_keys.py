"""Per-user API keys for a class (`--api-key-file FILE`): who a key is, what it may do, and what it has used.

The file is TOML; `reload()` (SIGHUP) swaps the key table and keeps each surviving name's usage:

    admin_key = "sk-teacher-..."          # the only key the admin routes (/models, /keys) accept

    [[keys]]
    name = "alice"
    key = "sk-alice-..."
    requests_per_minute = 20              # each limit is optional; absent = unlimited
    tokens_per_day = 50000                # prompt + completion tokens, per UTC day
    max_concurrent_requests = 2
    models = ["SmolLM2-135M-Instruct"]    # absent = every model

NOTE: keys are compared in constant time (hmac.compare_digest over every entry) and never logged or put in an
error message; only their names are.
"""
from __future__ import annotations

import contextvars
import hmac
import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter

from hearth.entrypoints.openai.toml_file import check_fields, read_toml, str_list, tables

logger = logging.getLogger("hearth")

_LIMIT_FIELDS = ("requests_per_minute", "tokens_per_day", "max_concurrent_requests")
_KEY_FIELDS = {"name", "key", "models", *_LIMIT_FIELDS}
ADMIN_NAME = "admin"


@dataclass(frozen=True)
class KeySpec:
    name: str
    key: str = field(repr=False)  # NOTE: repr=False so a logged or printed spec never shows the secret
    requests_per_minute: int | None = None
    tokens_per_day: int | None = None
    max_concurrent_requests: int | None = None
    models: frozenset[str] | None = None
    admin: bool = False


class LimitExceeded(Exception):
    """A key is over one of its limits: HTTP 429 with Retry-After (seconds) and a message naming the limit."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass
class KeyUsage:
    """One key's counters. Mutated on the event loop only (the guard and the metered streams run there)."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    in_flight: int = 0
    day: int = 0  # the UTC day (days since the epoch) that day_tokens counts
    day_tokens: int = 0
    reserved: int = 0  # tokens running requests may still use (token_quota.Charge): held against tokens_per_day
    recent: deque[float] = field(default_factory=deque)  # monotonic admission times within the last minute

    def as_dict(self) -> dict:
        return {"requests": self.requests, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "in_flight": self.in_flight,
                "tokens_today": self.day_tokens, "tokens_reserved": self.reserved,
                "requests_last_minute": len(self.recent)}


def _positive_int(entry: dict, name: str, where: str) -> int | None:
    value = entry.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: {name} must be a whole number >= 1, got {value!r}")
    return value


def parse_key_file(path: str) -> list[KeySpec]:
    """Read and validate the TOML key file; every mistake is a ValueError naming the entry and the field."""
    data = read_toml("--api-key-file", path)
    check_fields(data, {"admin_key", "keys"}, f"--api-key-file {path}", "top-level field(s)")
    entries = tables(data, "keys", f"--api-key-file {path}")
    specs: list[KeySpec] = []
    admin_key = data.get("admin_key")
    if admin_key is not None:
        if not isinstance(admin_key, str) or not admin_key:
            raise ValueError(f"--api-key-file {path}: admin_key must be a non-empty string")
        specs.append(KeySpec(ADMIN_NAME, admin_key, admin=True))
    for i, entry in enumerate(entries):
        where = f"--api-key-file {path}: keys[{i}]"
        name, key = entry.get("name"), entry.get("key")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: name must be a non-empty string")
        where = f"--api-key-file {path}: key {name!r}"
        check_fields(entry, _KEY_FIELDS, where)
        if not isinstance(key, str) or not key:
            raise ValueError(f"{where}: key must be a non-empty string")
        models = str_list(entry, "models", where)
        specs.append(KeySpec(name, key, *(_positive_int(entry, f, where) for f in _LIMIT_FIELDS),
                             frozenset(models) if models is not None else None))
    names = [s.name for s in specs]
    dup_names = {n for n in names if names.count(n) > 1}
    if dup_names:
        raise ValueError(f"--api-key-file {path}: key names must be unique; repeated: {sorted(dup_names)} "
                         f"({ADMIN_NAME!r} is the admin key's name)")
    keys = [s.key for s in specs]
    if len(set(keys)) != len(keys):
        bad = sorted({s.name for s in specs if keys.count(s.key) > 1})
        raise ValueError(f"--api-key-file {path}: the keys of {bad} are the same key; give each its own")
    if not any(not s.admin for s in specs) and admin_key is None:
        raise ValueError(f"--api-key-file {path}: no keys: add admin_key or [[keys]] entries")
    return specs


class KeyMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("hearth:key_requests", "Requests admitted, per API key name.", ["key_name"],
                                registry=registry)
        self.tokens = Counter("hearth:key_tokens", "Tokens used, per API key name; kind is prompt or completion.",
                              ["key_name", "kind"], registry=registry)


class KeyRing:
    """The keys in force and their usage. `lookup` is constant-time; `admit`/`release` enforce the limits."""

    def __init__(self, specs: list[KeySpec], path: str | None = None,
                 registry: CollectorRegistry | None = None, clock=time.monotonic, wall=time.time) -> None:
        self.path = path
        self._specs: list[tuple[bytes, KeySpec]] = []
        self.usage: dict[str, KeyUsage] = {}
        self.metrics = KeyMetrics(registry) if registry is not None else None
        self._clock, self._wall = clock, wall
        self._install(specs)

    @classmethod
    def from_file(cls, path: str, registry: CollectorRegistry | None = None) -> KeyRing:
        return cls(parse_key_file(path), path, registry)

    @classmethod
    def single(cls, api_key: str, registry: CollectorRegistry | None = None) -> KeyRing:
        """`--api-key KEY`: one unlimited key, which also opens the admin routes."""
        return cls([KeySpec("default", api_key, admin=True)], None, registry)

    def _install(self, specs: list[KeySpec]) -> None:
        # NOTE: everything here runs on the event loop (SIGHUP arrives through loop.add_signal_handler), and the
        # table is swapped in one assignment, so a request sees the old keys or the new ones, never a mix.
        for s in specs:
            self.usage.setdefault(s.name, KeyUsage())
        self._specs = [(f"Bearer {s.key}".encode(), s) for s in specs]

    def reload(self) -> bool:
        """Re-read the file (SIGHUP). A broken file keeps the keys in force and says why, once, in the log."""
        if self.path is None:
            return False
        try:
            specs = parse_key_file(self.path)
        except (ValueError, OSError) as e:
            logger.error("SIGHUP: keeping the current API keys: %s", e)
            return False
        self._install(specs)
        logger.info("SIGHUP: reloaded %d API keys from %s", len(specs), self.path)
        return True

    @property
    def specs(self) -> list[KeySpec]:
        return [s for _, s in self._specs]

    def lookup(self, authorization: bytes) -> KeySpec | None:
        """The key an Authorization header names, or None. NOTE: compares against every entry, so the time
        taken does not depend on which key (or how much of one) matched."""
        found = None
        for expected, spec in self._specs:
            if hmac.compare_digest(authorization, expected):
                found = spec
        return found

    # ---- limits ----
    def _today(self, u: KeyUsage) -> None:
        day = int(self._wall() // 86400)
        if u.day != day:
            u.day, u.day_tokens = day, 0

    def admit(self, spec: KeySpec) -> KeyUsage:
        """Count one request against the key's limits (call release() when it ends), or raise LimitExceeded."""
        u = self.usage.setdefault(spec.name, KeyUsage())
        now = self._clock()
        while u.recent and u.recent[0] <= now - 60.0:
            u.recent.popleft()
        if spec.requests_per_minute is not None and len(u.recent) >= spec.requests_per_minute:
            wait = max(1, math.ceil(u.recent[0] + 60.0 - now))
            raise LimitExceeded(f"rate limit reached for key {spec.name!r}: requests_per_minute = "
                                f"{spec.requests_per_minute}; retry in {wait} s", wait)
        self._today(u)
        if spec.tokens_per_day is not None and u.day_tokens + u.reserved >= spec.tokens_per_day:
            wait = max(1, math.ceil((u.day + 1) * 86400 - self._wall()))
            raise LimitExceeded(f"token quota reached for key {spec.name!r}: tokens_per_day = "
                                f"{spec.tokens_per_day} (used {u.day_tokens} today, UTC, {u.reserved} held by "
                                f"running requests); it resets at 00:00 UTC", wait)
        if spec.max_concurrent_requests is not None and u.in_flight >= spec.max_concurrent_requests:
            raise LimitExceeded(f"too many requests at once for key {spec.name!r}: max_concurrent_requests = "
                                f"{spec.max_concurrent_requests}; wait for one to finish", 1)
        u.recent.append(now)
        u.requests += 1
        u.in_flight += 1
        if self.metrics is not None:
            self.metrics.requests.labels(key_name=spec.name).inc()
        return u

    def hold(self, name: str, u: KeyUsage, quota: int | None, tokens: int) -> None:
        """Hold `tokens` of the key's daily quota for a request about to run (token_quota.Charge gives back what it
        does not use), or raise LimitExceeded when they do not fit beside today's use and the other holds."""
        self._today(u)
        if quota is not None and u.day_tokens + u.reserved + tokens > quota:
            left = max(0, quota - u.day_tokens - u.reserved)
            wait = max(1, math.ceil((u.day + 1) * 86400 - self._wall()))
            raise LimitExceeded(f"token quota: this request may use up to {tokens} tokens (its prompts, and n x "
                                f"max_tokens for each) and key {name!r} has {left} of its tokens_per_day = {quota} "
                                "left today (UTC): lower max_tokens or n, or wait until 00:00 UTC", wait)
        u.reserved += tokens

    def spent_today(self, u: KeyUsage) -> tuple[float, int]:
        """(the wall-clock time now, the key's tokens of today (UTC): used, plus held by its running requests)."""
        self._today(u)
        return self._wall(), u.day_tokens + u.reserved

    def release(self, u: KeyUsage) -> None:
        u.in_flight -= 1

    def add_tokens(self, name: str, u: KeyUsage, prompt: int, completion: int) -> None:
        self._today(u)
        u.prompt_tokens += prompt
        u.completion_tokens += completion
        u.day_tokens += prompt + completion
        if self.metrics is not None:
            if prompt:
                self.metrics.tokens.labels(key_name=name, kind="prompt").inc(prompt)
            if completion:
                self.metrics.tokens.labels(key_name=name, kind="completion").inc(completion)

    def report(self) -> list[dict]:
        """Every key's limits and usage (names only, never the keys), for GET /keys/usage."""
        out = []
        for s in self.specs:
            limits = {f: getattr(s, f) for f in _LIMIT_FIELDS}
            limits["models"] = sorted(s.models) if s.models is not None else None
            out.append({"name": s.name, "admin": s.admin, "limits": limits,
                        "usage": self.usage.get(s.name, KeyUsage()).as_dict()})
        return out


# ---- metering: the guard names the key of the request being served; the serving layer's stream counts ----
@dataclass
class Meter:
    ring: KeyRing
    name: str
    usage: KeyUsage
    tokens_per_day: int | None = None  # the key's quota, which token_quota.reserve holds a request's tokens in


current_meter: contextvars.ContextVar[Meter | None] = contextvars.ContextVar("hearth_key_meter", default=None)
# The key of the request being served (set by the guard on every keyed route; None when the server has no keys):
# what the request may see and touch follows from it (stored responses, cached answers, models).
current_key: contextvars.ContextVar[KeySpec | None] = contextvars.ContextVar("hearth_key", default=None)


def owner() -> str | None:
    """The name of the key serving this request: whose stored responses and cached answers it may see."""
    spec = current_key.get()
    return spec.name if spec is not None else None
