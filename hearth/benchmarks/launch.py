"""`hearth bench serve|soak --launch "COMMAND"`: start a server, time it to /health OK, sample its peak RSS, stop it;
and the /health poll and process-tree RSS both modes use."""
from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from typing import Self


def health_url(base_url: str) -> str:
    """A server's /health from its --base-url (a trailing /v1 is fine)."""
    return base_url.rstrip("/").removesuffix("/v1") + "/health"


def wait_healthy(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    """Poll URL until it answers 200; RuntimeError when PROC exits first or TIMEOUT_S passes."""
    import httpx  # here: every command imports the bench modules to build the CLI

    deadline = time.perf_counter() + timeout_s
    with httpx.Client(timeout=5.0) as client:
        while True:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"the launched server exited with code {proc.returncode} before {url} answered")
            try:
                if client.get(url).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{url} did not answer OK within {timeout_s:.0f} s")
            time.sleep(0.1)


def tree_rss_bytes(pid: int) -> int:
    """RSS of a process and all its children (a server's engine workers count too); 0 once it is gone."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def launched(ns: argparse.Namespace) -> contextlib.AbstractContextManager[LaunchedServer | None]:
    """`hearth bench serve|soak`: the server of --launch (started, healthy, stopped on exit), or None without it."""
    if not ns.launch:
        return contextlib.nullcontext()
    return LaunchedServer(ns.launch, health_url(ns.base_url), ns.launch_timeout)


class LaunchedServer:
    """A server process started in its own session (so stopping it stops its children too).

    NOTE: the RSS sampler runs from the start, so the peak covers loading as well as the benchmark.
    """

    def __init__(self, command: str, health_url: str, timeout_s: float = 600.0, sample_every_s: float = 0.2) -> None:
        self.command = command
        self.health_url = health_url
        self.timeout_s = timeout_s
        self.sample_every_s = sample_every_s
        self.startup_s: float | None = None
        self.peak_rss_bytes = 0
        self.proc: subprocess.Popen | None = None
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        # NOTE: kept open for the server's lifetime (closed in stop()), and kept on disk for reading afterwards.
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115
            prefix="hearth-bench-server-", suffix=".log", delete=False)
        self.log_path = self._log.name

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(shlex.split(self.command), stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self._sampler = threading.Thread(target=self._sample, name="rss-sampler", daemon=True)
        self._sampler.start()
        try:
            wait_healthy(self.health_url, self.timeout_s, self.proc)
        except RuntimeError as e:
            tail = self.log_tail()
            self.stop()
            raise RuntimeError(f"{e}; its log ({self.log_path}) ends:\n{tail}") from None
        self.startup_s = time.perf_counter() - t0

    def summary(self) -> dict:
        """What a bench result records about the server it launched."""
        return {"command": self.command, "startup_s": self.startup_s, "peak_rss_mb": self.peak_rss_bytes / 2**20,
                "log": self.log_path}

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_rss_bytes = max(self.peak_rss_bytes, tree_rss_bytes(self.proc.pid))
            self._stop.wait(self.sample_every_s)

    def log_tail(self, lines: int = 20) -> str:
        self._log.flush()
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def stop(self, grace_s: float = 20.0) -> None:
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join(timeout=2.0)
        proc = self.proc
        if proc is None or proc.poll() is not None:
            self._log.close()
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # our own session: the server and its children
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10.0)
        self._log.close()
