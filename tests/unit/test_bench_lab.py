"""`hearth bench lab` against a fake streaming server whose first token and token gaps are known, with a prefix cache
that counts hits the way hearth's /metrics does: the numbers the bench reports must be those delays, the ramp-up must
stagger the students, a missed SLO must say the level does not hold, and every prompt must share the preamble."""
import json
import socket
import threading
import time

import pytest

from hearth.benchmarks import cli_bench
from hearth.benchmarks.lab_load import parse_prefix_counters

pytestmark = pytest.mark.timeout(120)

FIRST_TOKEN_S = 0.25
TOKEN_GAP_S = 0.02
PREAMBLE, QUESTION, OUTPUT = 40, 8, 6


class FakeServer:
    """/v1/completions that waits FIRST_TOKEN_S, then streams one chunk per token TOKEN_GAP_S apart (usage last); its
    'prefix cache' hits the longest prefix a prompt shares with any earlier one, counted in tokens as vLLM does."""

    def __init__(self) -> None:
        self.prompts: list = []
        self.queried = self.hits = 0

    def _tokens(self, prompt) -> list:
        return prompt if isinstance(prompt, list) else prompt.split(" ")

    def _hit(self, tokens: list) -> int:
        best = 0
        for seen in self.prompts:
            other = self._tokens(seen)
            n = 0
            while n < min(len(tokens), len(other)) and tokens[n] == other[n]:
                n += 1
            best = max(best, n)
        return best

    def app(self):
        import asyncio

        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

        app = FastAPI()

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}

        @app.get("/metrics")
        async def metrics():
            labels = '{engine="0",model_name="fake-model"}'
            return PlainTextResponse(f"# TYPE vllm:prefix_cache_queries_total counter\n"
                                     f"vllm:prefix_cache_queries_total{labels} {float(self.queried)}\n"
                                     f"vllm:prefix_cache_hits_total{labels} {float(self.hits)}\n")

        @app.post("/v1/completions")
        async def completions(request: Request):
            body = await request.json()
            if body.get("model") != "fake-model" or not body.get("stream") or not body.get("ignore_eos"):
                return JSONResponse({"error": {"message": "bad request"}}, status_code=400)
            tokens = self._tokens(body["prompt"])
            self.queried += len(tokens)
            self.hits += self._hit(tokens)
            self.prompts.append(body["prompt"])
            n_out = body["max_tokens"]

            async def events():
                await asyncio.sleep(FIRST_TOKEN_S)
                for i in range(n_out):
                    if i:
                        await asyncio.sleep(TOKEN_GAP_S)
                    chunk = {"choices": [{"index": 0, "text": "", "finish_reason": None}]}  # tokens without text
                    yield f"data: {json.dumps(chunk)}\n\n"
                usage = {"prompt_tokens": len(tokens), "completion_tokens": n_out}
                yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")

        return app


@pytest.fixture
def fake():
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fake = FakeServer()
    server = uvicorn.Server(uvicorn.Config(fake.app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the fake server did not start"
        time.sleep(0.02)
    fake.url = f"http://127.0.0.1:{port}"
    yield fake
    server.should_exit = True
    thread.join(timeout=10)


def _lab(fake: FakeServer, *flags: str) -> list[str]:
    return ["bench", "lab", "--base-url", fake.url, "--preamble-len", str(PREAMBLE), "--question-len", str(QUESTION),
            "--output-len", str(OUTPUT), *flags]


def test_lab_reports_the_servers_delays_and_holds(fake, tmp_path):
    out, png = tmp_path / "lab.json", tmp_path / "lab.png"
    try:
        import matplotlib  # noqa: F401
        plot = ["--plot", str(png)]
    except ImportError:
        plot = []
    data = cli_bench.main(_lab(fake, "--students", "1,2", "--duration", "1.5", "--think-time", "0.2:0.2",
                               "--output-json", str(out), *plot))
    saved = json.loads(out.read_text())
    assert saved["mode"] == "lab" and saved["largest_holding"] == 2 and saved["ramp_up_s"] == pytest.approx(0.2)
    assert [r["students"] for r in saved["runs"]] == [1, 2]
    for run in data["runs"]:
        assert run["holds"] and run["why_not"] == [] and run["failed"] == 0
        # a cycle is 0.25 s to the first token + 5 gaps of 0.02 s + 0.2 s of thought: 3-4 questions each in 1.7 s
        assert 3 * run["students"] <= run["completed"] <= 5 * run["students"]
        assert FIRST_TOKEN_S <= run["ttft_s_p50"] <= run["ttft_s_p95"] < FIRST_TOKEN_S + 0.5
        # (output tokens - 1) / (last chunk - first chunk): 1 / TOKEN_GAP_S, give or take the event loops' jitter
        assert 0.4 / TOKEN_GAP_S <= run["decode_tok_s_p10"] <= run["decode_tok_s_p50"]
        assert run["decode_tok_s_p50"] == pytest.approx(1 / TOKEN_GAP_S, rel=0.25)
        assert run["total_output_tokens"] == OUTPUT * run["completed"]  # usage's count: the chunks have no text
        assert run["output_tok_s"] == pytest.approx(run["total_output_tokens"] / run["wall_s"])
        assert run["prompt_tokens_p50"] == PREAMBLE + QUESTION
        # The warm-up put the preamble in the cache, so every question of the level hits exactly the preamble.
        assert run["prefix_cache_hit_rate"] == pytest.approx(PREAMBLE / (PREAMBLE + QUESTION), abs=0.01)
    two = saved["runs"][1]["answers"]
    firsts = sorted(min(a["sent_s"] for a in two if a["student"] == s) for s in (0, 1))
    assert firsts[0] < 0.05 and 0.1 <= firsts[1] < 0.2  # student 1 of 2 starts half the ramp-up later
    preamble = fake.prompts[0][:PREAMBLE]
    assert all(p[:PREAMBLE] == preamble and len(p) == PREAMBLE + QUESTION for p in fake.prompts)
    assert len({tuple(p) for p in fake.prompts}) == len(fake.prompts)  # each question its own
    if plot:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_lab_missed_slo_does_not_hold_and_text_mode(fake):
    ns = cli_bench.build_parser().parse_args(_lab(fake, "--students", "2", "--duration", "0.5", "--think-time",
                                                  "0.1:0.3", "--prompt-mode", "text", "--ttft-slo", "0.1",
                                                  "--min-decode-tps", "100"))
    data = ns.bench_run(ns)
    run = data["runs"][0]
    assert data["largest_holding"] is None and not run["holds"] and run["completed"] >= 2
    assert run["why_not"][0].startswith("TTFT p95 0.") and run["why_not"][1].startswith("decode p10 ")
    assert ns.func(ns) == 0  # a level that does not hold is a result, not an error
    preamble = fake.prompts[0].split(" ")[:PREAMBLE]
    assert all(isinstance(p, str) and p.split(" ")[:PREAMBLE] == preamble for p in fake.prompts)


def test_lab_failures_fail_the_level_and_the_run(fake):
    ns = cli_bench.build_parser().parse_args(_lab(fake, "--model", "wrong-model", "--students", "1", "--duration",
                                                  "0.2", "--think-time", "0.1:0.1", "--warmup", "0"))
    data = ns.bench_run(ns)
    run = data["runs"][0]
    assert run["completed"] == 0 and run["failed"] >= 1 and not run["holds"]
    assert run["why_not"] == [f"{run['failed']} failed", "none completed"] and "HTTP 400" in run["errors"][0]
    assert ns.func(ns) == 1  # nothing ever completed: the server is not working
    ns.warmup = 1
    assert ns.func(ns) == 1  # (the warm-up's failure, reported before any level runs)


def test_prefix_counters_parse_hearths_metrics():
    from hearth.metrics import ServerMetrics

    m = ServerMetrics("m")
    m.prefix_queries.inc(300)
    m.prefix_hits.inc(240)
    assert parse_prefix_counters(m.render().decode()) == (300.0, 240.0)
    assert parse_prefix_counters("vllm:num_requests_running 1.0\n") is None
