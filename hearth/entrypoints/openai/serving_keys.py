"""Keys on the server side: building the KeyRing from the flags, SIGHUP reloads, and GET /keys/usage (admin)."""
from __future__ import annotations

import asyncio
import logging
import signal

from fastapi import FastAPI

from hearth.entrypoints.openai.api_keys import KeyRing
from hearth.metrics import ServerMetrics

logger = logging.getLogger("hearth")


def key_ring(api_key: str | None, api_key_file: str | None, metrics: ServerMetrics | None) -> KeyRing | None:
    """--api-key-file FILE (per-user keys and limits) or --api-key KEY (one unlimited key); neither: no keys."""
    if api_key and api_key_file:
        raise ValueError("--api-key and --api-key-file both given: pass one (put a shared key in the file)")
    registry = metrics.registry if metrics is not None else None
    if api_key_file:
        return KeyRing.from_file(api_key_file, registry)
    return KeyRing.single(api_key, registry) if api_key else None


def reload_on_sighup(keys: KeyRing | None) -> None:
    """Re-read --api-key-file on SIGHUP (`kill -HUP PID`). Only the main thread's loop can take signals: a server
    run elsewhere (in-process tests) keeps its keys."""
    if keys is None or keys.path is None:
        return
    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, keys.reload)
    except (RuntimeError, ValueError, NotImplementedError) as e:
        logger.warning("SIGHUP will not reload %s here: %s", keys.path, e)


def register(app: FastAPI, keys: KeyRing | None) -> None:
    @app.get("/keys/usage")
    async def keys_usage() -> dict:
        """Every key's name, limits and usage since the server started (never the keys themselves)."""
        return {"object": "list", "data": keys.report() if keys is not None else []}
