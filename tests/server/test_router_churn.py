"""The model router's front after load/unload cycles (issue 44, defect 7): an unloaded model leaves nothing of its
own in the front process (its serving context, tokenizer, engine client), and the front's RSS comes back to its
baseline however many times models are swapped under --max-loaded-models 1.

The growth was the allocator, not kept objects: glibc held the heap pages freed by an unloaded model's tokenizer
(and by unpickling the next one) in the reader threads' arenas. Only a large vocabulary makes it visible, so the
RSS test's tiny checkpoints carry a 200k-entry tokenizer, as a real model's.
"""
from __future__ import annotations

import asyncio
import os
import weakref
from pathlib import Path

import httpx
import psutil
import pytest

from tests.server.conftest import start_server

HELLO = [{"role": "user", "content": "Hello there"}]


def _two_models(folder: Path, checkpoint: str) -> Path:
    """Two models of one checkpoint: what matters is that they take turns, not what they hold."""
    models = folder / "models"
    models.mkdir()
    for name in ("a", "b"):
        os.symlink(checkpoint, models / name)
    return models


def test_an_unloaded_model_leaves_nothing_in_the_front(tiny_model: str, tmp_path: Path) -> None:
    from hearth.engine_args import EngineArgs
    from hearth.entrypoints.openai.model_router import ModelRouter, RouterConfig
    from hearth.entrypoints.openai.model_specs import specs_from_dir
    from hearth.entrypoints.openai.server import ServerConfig, build_app

    router = ModelRouter(specs_from_dir(str(_two_models(tmp_path, tiny_model))),
                         EngineArgs(model="x", kv_cache_space=0.05, threads=1, max_model_len=256),
                         RouterConfig(max_loaded_models=1))
    app = build_app(None, None, ServerConfig(), router=router)

    async def run() -> None:
        await router.start()
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost",
                                         timeout=120) as c:
                before: dict[str, weakref.ref] = {}
                for name in ("a", "b", "a"):  # each load unloads the other model
                    r = await c.post("/v1/chat/completions", json={"model": name, "messages": HELLO,
                                                                   "max_tokens": 3})
                    assert r.status_code == 200, r.text
                    r = await c.post("/tokenize", json={"model": name, "prompt": "Hello"})
                    assert r.status_code == 200, r.text
                    # NOTE: no gc.collect() here: the unload itself must have let go of everything
                    assert [what for what, ref in before.items() if ref() is not None] == [], \
                        "the unloaded model's front state is still alive"
                    ctx = router.resolve(name).ctx
                    before = {"serving context": weakref.ref(ctx), "tokenizer": weakref.ref(ctx.tokenizer),
                              "engine client": weakref.ref(ctx.engine),
                              **{f"worker client {i}": weakref.ref(rank) for i, rank in enumerate(ctx.engine.ranks)}}
                    del ctx
        finally:
            await router.shutdown()

    asyncio.run(run())


CYCLES = 8  # each load spawns a worker process (seconds each on 2 cores); the growth showed from the first swaps
WARM_UP = 2  # cycles before the baseline: the first loads import and cache what every later one reuses
RSS_SLACK_MB = 50


@pytest.mark.slow
def test_front_rss_stays_flat_over_load_unload_cycles(tmp_path_factory: pytest.TempPathFactory) -> None:
    from tests.tiny_models import build_checkpoint, large_vocab_tokenizer, tiny_config

    d = tmp_path_factory.mktemp("churn")
    tok = large_vocab_tokenizer(200_000)
    checkpoint = build_checkpoint(str(d / "big-vocab"), tiny_config(
        "llama", vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_attention_heads=2,
        num_key_value_heads=1), tokenizer=tok)
    srv = start_server(["--models-dir", str(_two_models(d, checkpoint)), "--max-loaded-models", "1",
                        "--kv-cache-space", "0.05", "--threads", "1", "--max-model-len", "256"], str(d / "server.log"))
    front = psutil.Process(srv.proc.pid)
    rss: list[float] = []
    try:
        for _ in range(CYCLES):
            for name in ("a", "b"):
                r = srv.http.post("/v1/completions", json={"model": name, "prompt": "Hello there", "max_tokens": 2},
                                  timeout=120)
                assert r.status_code == 200, r.text
            rss.append(front.memory_info().rss / 2 ** 20)
    finally:
        srv.stop()
    baseline = rss[WARM_UP - 1]
    figures = " ".join(f"{x:.0f}" for x in rss)
    assert max(rss[WARM_UP:]) - baseline <= RSS_SLACK_MB, f"the front grew over the cycles (MB): {figures}"
    print(f"front RSS per cycle (MB): {figures}")
