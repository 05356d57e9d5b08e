"""The answer cache: whole response bodies of repeatable requests (temperature 0 or a fixed seed), kept LRU with a
TTL, so a hot question is answered without touching the engine or the upstream."""
from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from cachetools import TTLCache
from prometheus_client import CollectorRegistry, Counter

# Marks an SSE error event (serving_common.sse_stream, or an upstream's): a stream that carried one is not kept.
_SSE_ERROR = b'data: {"error"'


@dataclass(frozen=True)
class CachedAnswer:
    body: bytes
    media_type: str
    usage: tuple[int, int] = (0, 0)  # (prompt, completion) tokens it took: what a hit charges the key


def repeatable(obj: dict[str, Any]) -> bool:
    """Greedy (temperature 0) or seeded requests give the same answer each time; others must not be cached."""
    return obj.get("temperature") == 0 or obj.get("seed") is not None


def cache_key(path: str, model: str, obj: dict[str, Any], key_name: str | None) -> str:
    """Same API key, endpoint, model, messages/prompt and parameters (stream included: an SSE body is not a JSON
    body). NOTE: per key, so a hit (x-hearth-route: cache) never tells one key what another asked."""
    canon = json.dumps({**obj, "model": model}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{key_name!r}\n{path}\n{canon}".encode()).hexdigest()


class AnswerCache:
    """Thread-unsafe by design: only the event loop touches it."""

    def __init__(self, size: int, ttl: float, registry: CollectorRegistry) -> None:
        self._entries: TTLCache[str, CachedAnswer] = TTLCache(maxsize=size, ttl=ttl)
        self.hits = Counter("hearth:answer_cache_hits", "Answer cache hits, in requests.", registry=registry)
        self.queries = Counter("hearth:answer_cache_queries",
                               "Answer cache lookups (repeatable requests only), in requests.", registry=registry)

    def get(self, key: str) -> CachedAnswer | None:
        self.queries.inc()
        answer = self._entries.get(key)
        if answer is not None:
            self.hits.inc()
        return answer

    def put(self, key: str, body: bytes, media_type: str, usage: tuple[int, int] = (0, 0)) -> None:
        self._entries[key] = CachedAnswer(body, media_type, usage)

    async def tee(self, key: str, chunks: AsyncIterator[bytes | str], media_type: str,
                  usage: Callable[[bytes], tuple[int, int]] = lambda _: (0, 0)) -> AsyncIterator[bytes]:
        """Pass a streamed body through and keep it once it ended cleanly (not cut off, no error event)."""
        parts: list[bytes] = []
        async for chunk in chunks:
            data = chunk.encode() if isinstance(chunk, str) else chunk
            parts.append(data)
            yield data
        body = b"".join(parts)
        if _SSE_ERROR not in body:
            self.put(key, body, media_type, usage(body))
