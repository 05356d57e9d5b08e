"""`hearth serve --tensor-parallel-size 2`: the same greedy completions as one rank, through the HTTP server."""
from __future__ import annotations

import psutil
import pytest

from hearth import LLM, SamplingParams
from tests.server.conftest import start_server

pytestmark = pytest.mark.slow
ARGS = ["--threads", "1", "--kv-cache-space", "0.05", "--dtype", "float32"]


def test_serve_tp2_matches_tp1(tiny_model: str, tmp_path) -> None:
    prompts = [[5, 17, 42, 99, 3], [250, 251, 252], [7] * 12, [300, 12, 64, 128, 1 + 1]]
    llm = LLM(tiny_model, threads=1, kv_cache_space=0.05, dtype="float32")
    want = [o.outputs[0].text for o in llm.generate(
        [{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))]
    del llm
    srv = start_server([tiny_model, *ARGS, "--tensor-parallel-size", "2"], str(tmp_path / "tp2.log"))
    try:
        client = srv.client()
        got = [client.completions.create(model="tiny", prompt=p, max_tokens=24, temperature=0.0,
                                         extra_body={"ignore_eos": True}).choices[0].text for p in prompts]
        assert got == want
        stream = client.completions.create(model="tiny", prompt=prompts[0], max_tokens=24, temperature=0.0,
                                           stream=True, extra_body={"ignore_eos": True})
        assert "".join(c.choices[0].text for c in stream if c.choices) == want[0]
        assert srv.health()["kv_used_blocks"] == 0
        workers = psutil.Process(srv.proc.pid).children()
        assert [w.cmdline()[-1] for w in workers if "multiprocessing" in " ".join(w.cmdline())]
    finally:
        srv.stop()
    assert "Traceback" not in srv.read_log()
    gone, alive = psutil.wait_procs(workers, timeout=15)
    assert not alive  # the rank-1 worker left with the server


def test_serve_gguf_tp2_matches_tp1(tiny_model: str, tmp_path) -> None:
    """`hearth serve FILE.gguf -tp 2`: the GGUF's Q4_0 blocks stay quantized, each rank packing its own slice."""
    import gguf

    from tests.gguf_writer import write_gguf

    path = str(tmp_path / "tiny-q4_0.gguf")
    write_gguf(tiny_model, path, gguf.GGMLQuantizationType.Q4_0)
    prompts = [[5, 17, 42, 99, 3], [250, 251, 252]]
    llm = LLM(path, threads=1, kv_cache_space=0.05, dtype="float32")
    want = [o.outputs[0].text for o in llm.generate(
        [{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))]
    del llm
    srv = start_server([path, *ARGS, "-tp", "2"], str(tmp_path / "tp2-gguf.log"))
    try:
        client = srv.client()
        got = [client.completions.create(model="tiny-q4_0", prompt=p, max_tokens=24, temperature=0.0,
                                         extra_body={"ignore_eos": True}).choices[0].text for p in prompts]
        assert got == want
    finally:
        srv.stop()
    log = srv.read_log()
    assert "Traceback" not in log and "quantization gguf: 8 linear layers quantized" in log
