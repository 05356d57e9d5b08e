"""A real `hearth serve` subprocess on 127.0.0.1 and a free port, driven over HTTP (official openai client, httpx)."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

STARTUP_TIMEOUT = 240.0  # seconds; model loading on a busy 2-core CI box


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, args: list[str], log_path: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        cmd = [sys.executable, "-m", "hearth.entrypoints.openai.cli_serve", *args, "--port", str(self.port),
               "--uvicorn-log-level", "warning"]
        self.log = open(log_path, "w")  # noqa: SIM115 (held open for the process lifetime; closed in stop())
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        # One kept client for health/metrics: a fresh httpx.get builds an SSL context (~60 ms), which made every
        # scrape slower than the bursts tests look into.
        self.http = httpx.Client(base_url=self.url, timeout=10)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.read_log()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"server not ready after {STARTUP_TIMEOUT} s:\n{self.read_log()}")

    def read_log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        self.http.close()
        return self.proc.returncode

    # ---- helpers for tests ----
    def client(self, api_key: str = "none") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=120)

    def async_client(self, api_key: str = "none") -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=120)

    def health(self) -> dict:
        return self.http.get("/health").json()

    def metrics(self) -> dict[str, float]:
        """The /metrics exposition as {'name{labels}': value}."""
        text = self.http.get("/metrics").text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a metric's samples whose labels include `labels`."""
        total = 0.0
        for key, value in self.metrics().items():
            m = re.fullmatch(r"([^{]+)(?:\{(.*)\})?", key)
            if m is None or m.group(1) != name:
                continue
            have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            if all(have.get(k) == v for k, v in labels.items()):
                total += value
        return total


def start_server(args: list[str], log_path: str, env: dict[str, str] | None = None) -> ServerProcess:
    server = ServerProcess(args, log_path, env)
    try:
        server.wait_ready()
    except BaseException:
        server.stop(5)
        raise
    return server


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tests.tiny_models import build_checkpoint, tiny_config

    return build_checkpoint(str(tmp_path_factory.mktemp("tiny") / "tiny"), tiny_config("llama"))


TINY_ARGS = ["--kv-cache-space", "0.05", "--max-request-body-bytes", "200000", "--threads", "1"]


@pytest.fixture(scope="session")
def server(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The shared tiny-model server (mechanics only: the model is random)."""
    srv = start_server([tiny_model, *TINY_ARGS], str(tmp_path_factory.mktemp("logs") / "tiny.log"))
    yield srv
    srv.stop()


@pytest.fixture
def client(server: ServerProcess) -> openai.OpenAI:
    return server.client()


def wait_until(predicate, timeout: float = 15.0, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
