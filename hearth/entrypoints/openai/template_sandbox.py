"""Chat templates rendered off the event loop, with limits.

The server's own template renders in a thread. A template sent in a request is untrusted code: Jinja's sandbox
caps each range() but not the total work or memory (three nested loops, or 'a' * 10**9), so it renders in a
separate worker process under a memory limit, killed when it passes the time limit or its client goes away (a
thread cannot be stopped). Either way the rendered text has a size limit. Over a limit is a 400 naming it.
"""
from __future__ import annotations

import asyncio
import logging
import multiprocessing
import threading
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("hearth")

RENDER_TIMEOUT_S = 1.0
WORKER_MEMORY_BYTES = 512 * 1024 * 1024  # address space a request's template may add to the worker's own
_START_TIMEOUT_S = 60.0  # the worker imports transformers' renderer before its first render


class TemplateLimitError(ValueError):
    """A chat template passed a limit (time, output size, memory): the request's fault, a 400."""


def _worker(conn: Any, memory_bytes: int) -> None:
    """The worker process: render what arrives, one at a time, until the pipe closes."""
    import resource

    from transformers.utils.chat_template_utils import render_jinja_template

    with open("/proc/self/status") as f:  # the limit counts from what the worker already maps
        vm = next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:")), 0)
    if vm:
        resource.setrlimit(resource.RLIMIT_AS, (vm + memory_bytes, resource.RLIM_INFINITY))
    conn.send(("ready", None))
    while True:
        try:
            kwargs, max_chars = conn.recv()
        except EOFError:
            return
        try:
            text = render_jinja_template(**kwargs)[0][0]
            if len(text) > max_chars:
                conn.send(("limit", f"the rendered chat template is longer than the limit of {max_chars} "
                                    "characters"))
            else:
                conn.send(("ok", text))
        except MemoryError:
            conn.send(("limit", f"the chat template needs more than the limit of {memory_bytes >> 20} MiB"))
        except Exception as e:  # noqa: BLE001 (a user's template raises anything; all of it is a 400)
            conn.send(("error", f"{type(e).__name__}: {str(e)[:500]}"))


class _Worker:
    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # never fork a process with an engine thread and OpenMP
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, WORKER_MEMORY_BYTES), name="hearth-template",
                                daemon=True)
        self.proc.start()
        child.close()
        if not self.conn.poll(_START_TIMEOUT_S):
            self.kill()
            raise RuntimeError("the chat template worker did not start")
        self.conn.recv()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(5)
        self.conn.close()


class SandboxRenderer:
    """Renders untrusted templates in one worker process (started on first use, restarted after a kill)."""

    def __init__(self, timeout_s: float = RENDER_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._worker: _Worker | None = None
        self._lock = threading.Lock()

    def render(self, kwargs: dict[str, Any], max_chars: int, cancelled: threading.Event) -> str:
        """Blocking (call from a thread). Raises TemplateLimitError or ValueError (both 400s)."""
        with self._lock:
            if self._worker is None or not self._worker.proc.is_alive():
                self._worker = _Worker()
            w = self._worker
            try:
                w.conn.send((kwargs, max_chars))
            except (OSError, ValueError) as e:  # unpicklable kwargs or a dead pipe
                self._kill()
                raise ValueError(f"cannot pass these values to the chat template: {e}") from None
            deadline = time.monotonic() + self.timeout_s
            while not w.conn.poll(0.02):
                if cancelled.is_set() or time.monotonic() > deadline or not w.proc.is_alive():
                    self._kill()
                    if cancelled.is_set():
                        raise TemplateLimitError("the client went away")
                    if time.monotonic() > deadline:
                        raise TemplateLimitError(f"the chat template took longer than the limit of "
                                                 f"{self.timeout_s:g} s to render")
                    raise TemplateLimitError("the chat template stopped its renderer")
            try:
                status, value = w.conn.recv()
            except EOFError:
                self._kill()
                raise TemplateLimitError("the chat template stopped its renderer") from None
        if status == "ok":
            return value
        if status == "limit":
            raise TemplateLimitError(value)
        raise ValueError(value)

    def _kill(self) -> None:
        if self._worker is not None:
            self._worker.kill()
            self._worker = None

    def shutdown(self) -> None:
        with self._lock:
            self._kill()


async def run_watched(fn: Callable[[threading.Event], str], disconnected: Callable[[], Any] | None) -> str:
    """Run fn(cancelled) in a thread; if `disconnected()` (an awaitable that completes when the client goes)
    finishes first, set `cancelled` so fn stops, and raise TemplateLimitError."""
    cancelled = threading.Event()
    work = asyncio.ensure_future(asyncio.to_thread(fn, cancelled))
    if disconnected is None:
        return await work
    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not work.done():
        cancelled.set()
    return await work
