"""uvicorn, as hearth runs it: a request-header timeout (slowloris, idle half-open connections) and a shutdown
that drains, ends what is still open, and exits 0 after SIGTERM or SIGINT."""
from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable, Generator
from types import FrameType
from typing import Any

import uvicorn

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Base
except ImportError:  # httptools is optional in uvicorn
    from uvicorn.protocols.http.h11_impl import H11Protocol as _Base  # type: ignore[assignment]

DEFAULT_HEADER_TIMEOUT = 10.0


def header_timeout_protocol(seconds: float) -> type:
    """uvicorn's HTTP protocol, closing a connection whose request headers are not complete `seconds` after it
    opened (or after its previous response): uvicorn itself holds a silent connection forever."""

    class HeaderTimeoutProtocol(_Base):  # type: ignore[misc, valid-type]
        _header_timer: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(seconds, self._header_timeout)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            busy = self.cycle is not None and not self.cycle.response_complete
            if not busy and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_headers_complete(self) -> None:  # httptools' callback
            self._disarm()
            super().on_headers_complete()

        def handle_events(self) -> None:  # h11's: a request whose headers arrived has a cycle
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

    return HeaderTimeoutProtocol


class Server(uvicorn.Server):
    """uvicorn.Server that calls on_exit once, on the event loop, at the first SIGTERM/SIGINT (to start the drain
    deadline), and does not re-raise the signal after a graceful shutdown, so the process exits 0."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self._on_exit = on_exit
        self._exit_started = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if not self._exit_started and self._on_exit is not None:
            self._exit_started = True
            with contextlib.suppress(RuntimeError):  # no running loop: nothing to drain
                asyncio.get_running_loop().call_soon_threadsafe(self._on_exit)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)
