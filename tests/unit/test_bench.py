"""`hearth bench`: latency and throughput on a tiny checkpoint; serve against a small fake streaming server.

Run as a script (`python tests/unit/test_bench.py --fake-server PORT`) this file is that fake server, which the
--launch test starts as a subprocess.
"""

import asyncio
import json
import os
import random
import socket
import sys
import threading
import time

FAKE_TOKEN_DELAY_S = 0.002


def fake_app():
    """An OpenAI-compatible streaming /v1/completions that checks what the bench client sends."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI()

    @app.get("/health")
    async def health():
        return {}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        prompt = body.get("prompt")
        ok = (body.get("model") == "fake-model" and body.get("stream") is True and body.get("ignore_eos") is True
              and body.get("temperature") == 0 and isinstance(body.get("max_tokens"), int)
              and (isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt))))
        if not ok:
            return JSONResponse({"error": {"message": f"bad request {body}"}}, status_code=400)
        n_prompt = len(prompt) if isinstance(prompt, list) else len(prompt.split())
        n_out = body["max_tokens"]

        async def events():
            for i in range(n_out):
                await asyncio.sleep(FAKE_TOKEN_DELAY_S)
                chunk = {"id": "cmpl-1", "object": "text_completion", "model": "fake-model",
                         "choices": [{"index": 0, "text": f" t{i}", "finish_reason": "length" if i == n_out - 1
                                      else None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            usage = {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}
            yield f"data: {json.dumps({'id': 'cmpl-1', 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--fake-server":
    import uvicorn

    uvicorn.run(fake_app(), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
    sys.exit(0)

# (imported after the fake-server entry point above, which runs without them)
import pytest  # noqa: E402

from hearth.benchmarks import cli_bench  # noqa: E402
from hearth.benchmarks.common import TokenSampler, parse_int_list, percentile  # noqa: E402

pytestmark = pytest.mark.timeout(120)

ENGINE_FLAGS = ["--kv-cache-space", "0.02", "--max-model-len", "128"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    from tests.tiny_models import build_checkpoint, tiny_config

    return build_checkpoint(str(tmp_path_factory.mktemp("bench") / "tiny-llama"), tiny_config("llama"))


@pytest.fixture
def fake_server():
    import uvicorn

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(fake_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the fake server did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def _positive(data: dict, keys: list[str]) -> None:
    for k in keys:
        assert k in data, k
        assert isinstance(data[k], (int, float)) and data[k] > 0, (k, data[k])


def test_helpers():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    assert parse_int_list("1,4, 8") == [1, 4, 8]
    with pytest.raises(ValueError):
        parse_int_list("0,2")
    sampler = TokenSampler(0, 10, excluded={0, 1, 2})
    ids = sampler.sample(200, random.Random(0))
    assert len(ids) == 200 and all(3 <= t < 10 for t in ids)
    assert ids == TokenSampler(0, 10, excluded={0, 1, 2}).sample(200, random.Random(0))  # seeded


def test_latency(tiny_model, tmp_path):
    out = tmp_path / "latency.json"
    data = cli_bench.main(["bench", "latency", tiny_model, *ENGINE_FLAGS, "--input-len", "8", "--output-len", "6",
                           "--batch-size", "2", "--num-iters", "2", "--warmup", "1", "--output-json", str(out)])
    saved = json.loads(out.read_text())
    assert saved["mode"] == "latency" and saved["batch_size"] == 2 and len(saved["iterations"]) == 2
    _positive(saved, ["ttft_ms", "prefill_tok_s", "decode_tok_s", "decode_tok_s_per_seq", "tpot_ms", "e2e_s",
                      "load_s"])
    assert all(it["decode_steps"] == 5 for it in saved["iterations"])  # output-len - 1, both sequences together
    assert data["decode_tok_s"] == saved["decode_tok_s"]


def test_throughput(tiny_model, tmp_path):
    out = tmp_path / "throughput.json"
    cli_bench.main(["bench", "throughput", tiny_model, *ENGINE_FLAGS, "--max-num-seqs", "3", "--input-len", "8",
                    "--output-len", "5", "--num-prompts", "7", "--output-json", str(out)])
    saved = json.loads(out.read_text())
    assert saved["completed"] == 7 and saved["total_output_tokens"] == 35 and saved["max_num_seqs"] == 3
    _positive(saved, ["elapsed_s", "output_tok_s", "total_tok_s", "requests_per_s", "ttft_ms_p50", "e2e_s_p99"])
    assert saved["total_tok_s"] > saved["output_tok_s"]


def test_serve_token_ids(fake_server, tmp_path):
    out = tmp_path / "serve.json"
    cli_bench.main(["bench", "serve", "--base-url", fake_server + "/v1", "--num-prompts", "6",
                    "--max-concurrency", "1,3", "--input-len", "16", "--output-len", "5", "--output-json", str(out)])
    saved = json.loads(out.read_text())
    assert saved["model"] == "fake-model" and saved["launch"] is None
    assert [r["max_concurrency"] for r in saved["runs"]] == [1, 3]
    for run in saved["runs"]:
        assert run["completed"] == 6 and run["failed"] == 0 and run["total_output_tokens"] == 30
        assert run["total_input_tokens"] == 6 * 16
        _positive(run, ["output_tok_s", "total_tok_s", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99",
                        "tpot_ms_p50", "e2e_s_p50", "e2e_s_p99"])
        assert run["itl_ms_p50"] >= FAKE_TOKEN_DELAY_S * 1000 * 0.5


def test_serve_text_mode_and_errors(fake_server, tmp_path):
    data = cli_bench.main(["bench", "serve", "--base-url", fake_server, "--model", "fake-model", "--prompt-mode",
                           "text", "--num-prompts", "3", "--max-concurrency", "2", "--input-len", "10",
                           "--output-len", "3", "--warmup", "0"])
    assert data["runs"][0]["completed"] == 3
    data = cli_bench.main(["bench", "serve", "--base-url", fake_server, "--model", "wrong-model",
                           "--num-prompts", "2", "--output-len", "3", "--warmup", "0"])
    run = data["runs"][0]
    assert run["completed"] == 0 and run["failed"] == 2 and "HTTP 400" in run["errors"][0]


def test_serve_plot(fake_server, tmp_path):
    png = tmp_path / "serve.png"
    argv = ["bench", "serve", "--base-url", fake_server, "--num-prompts", "2", "--max-concurrency", "1,2",
            "--output-len", "3", "--plot", str(png)]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="pip install matplotlib"):
            cli_bench.main(argv)
        return
    cli_bench.main(argv)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_serve_launch(tmp_path):
    port = _free_port()
    out = tmp_path / "launch.json"
    command = f"{sys.executable} {os.path.abspath(__file__)} --fake-server {port}"
    cli_bench.main(["bench", "serve", "--base-url", f"http://127.0.0.1:{port}", "--launch", command,
                    "--launch-timeout", "60", "--num-prompts", "3", "--max-concurrency", "3", "--output-len", "4",
                    "--output-json", str(out)])
    launch = json.loads(out.read_text())["launch"]
    _positive(launch, ["startup_s", "peak_rss_mb"])
    with socket.socket() as s:  # the server was stopped: its port is free again
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_soak_launch(tmp_path):
    """soak --launch shares serve's launcher: started, healthy, its RSS sampled, stopped afterwards."""
    port = _free_port()
    out = tmp_path / "soak.json"
    command = f"{sys.executable} {os.path.abspath(__file__)} --fake-server {port}"
    data = cli_bench.main(["bench", "soak", "--base-url", f"http://127.0.0.1:{port}", "--launch", command,
                           "--launch-timeout", "60", "--duration", "1", "--concurrency", "1", "--rss-every", "0.5",
                           "--output-json", str(out)])
    assert sum(data["statuses"].values()) > 0
    assert json.loads(out.read_text())["samples"][0]["rss_mb"] > 0
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_launch_failure_names_the_exit():
    """A server command that dies before /health answers is reported with its exit code and log, not waited out."""
    from hearth.benchmarks.launch import LaunchedServer, health_url

    assert health_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000/health"
    command = f"{sys.executable} -c \"import sys; print('no model here'); sys.exit(3)\""
    with pytest.raises(RuntimeError, match=r"exited with code 3 .*\n.*no model here"):
        LaunchedServer(command, f"http://127.0.0.1:{_free_port()}/health", timeout_s=30).start()
