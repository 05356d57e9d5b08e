"""`hearth bench soak`: varied load for a long time against a server, its RSS sampled at a fixed interval.

    hearth bench soak --launch "hearth serve" --duration 600 --concurrency 4 --rss-every 30

Each client loops until the duration is up, picking at random: a short or long completion, a chat completion, a
stream it reads to the end, or a stream it abandons after the first event. Reports the requests by status, and the
server's RSS (its process and children; --launch or --pid) with the KV blocks in use at every sample. A server that
leaks shows RSS that keeps climbing with the working set flat.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections import Counter
from typing import TYPE_CHECKING

from hearth.benchmarks.launch import launched, tree_rss_bytes

if TYPE_CHECKING:
    import httpx


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    p.add_argument("--concurrency", type=int, default=4, help="clients in parallel (default 4)")
    p.add_argument("--rss-every", type=float, default=30.0, help="seconds between RSS samples (default 30)")
    p.add_argument("--pid", type=int, default=None, help="the server's process id, for RSS (without --launch)")
    p.add_argument("--seed", type=int, default=0, help="request mix seed")
    p.add_argument("--launch", default=None, metavar="COMMAND", help="start this server command first, stop it after")
    p.add_argument("--launch-timeout", type=float, default=600.0, help="seconds to wait for /health")


async def _one(client: httpx.AsyncClient, rng: random.Random, statuses: Counter) -> None:
    words = " ".join(rng.choice(["lab", "cpu", "token", "cache", "model", "shared", "queue"])
                     for _ in range(rng.choice([4, 32, 200])))
    kind = rng.choice(["short", "long", "chat", "stream", "abandon"])
    if kind == "chat":
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": words}],
                                              "max_tokens": rng.randint(8, 64)}
    else:
        path, body = "/v1/completions", {"prompt": words, "max_tokens": 8 if kind == "short" else rng.randint(32, 128),
                                         "ignore_eos": kind == "long"}
    if kind in ("stream", "abandon"):
        body["stream"] = True
        async with client.stream("POST", path, json=body) as r:
            statuses[f"{r.status_code}{' abandoned' if kind == 'abandon' else ''}"] += 1
            async for _ in r.aiter_lines():
                if kind == "abandon":
                    break
        return
    r = await client.post(path, json=body)
    statuses[str(r.status_code)] += 1


async def _soak(ns: argparse.Namespace, pid: int | None) -> dict:
    import httpx  # here: every command imports the bench modules to build the CLI

    statuses: Counter = Counter()
    errors: Counter = Counter()
    samples: list[dict] = []
    deadline = time.monotonic() + ns.duration
    t0 = time.monotonic()

    async def client_loop(i: int) -> None:
        rng = random.Random(ns.seed * 1000 + i)
        async with httpx.AsyncClient(base_url=ns.base_url, timeout=300) as client:
            while time.monotonic() < deadline:
                try:
                    await _one(client, rng, statuses)
                except httpx.HTTPError as e:
                    errors[type(e).__name__] += 1

    async def sampler() -> None:
        async with httpx.AsyncClient(base_url=ns.base_url, timeout=30) as client:
            while True:
                h = (await client.get("/health")).json()
                samples.append({"t_s": round(time.monotonic() - t0, 1),
                                "rss_mb": round(tree_rss_bytes(pid) / 2**20, 1) if pid else None,
                                "kv_used_blocks": h.get("kv_used_blocks"), "running": h.get("num_requests_running")})
                print(f"t={samples[-1]['t_s']:7.1f} s  rss={samples[-1]['rss_mb']} MB  "
                      f"kv_used_blocks={samples[-1]['kv_used_blocks']}  requests={sum(statuses.values())}",
                      flush=True)
                if time.monotonic() >= deadline:
                    return
                await asyncio.sleep(min(ns.rss_every, max(0.0, deadline - time.monotonic())))

    watch = asyncio.create_task(sampler())
    await asyncio.gather(*(client_loop(i) for i in range(ns.concurrency)))
    await watch
    return {"duration_s": ns.duration, "concurrency": ns.concurrency, "statuses": dict(statuses),
            "client_errors": dict(errors), "samples": samples}


def run(ns: argparse.Namespace) -> dict:
    if ns.concurrency < 1 or ns.duration <= 0 or ns.rss_every <= 0:
        raise ValueError("--concurrency must be >= 1, --duration and --rss-every > 0")
    with launched(ns) as server:
        data = asyncio.run(_soak(ns, server.proc.pid if server else ns.pid))
    rss = [s["rss_mb"] for s in data["samples"] if s["rss_mb"] is not None]
    print(f"requests by status: {data['statuses']}; client errors: {data['client_errors'] or 'none'}")
    if rss:
        print(f"RSS: first {rss[0]} MB, max {max(rss)} MB, last {rss[-1]} MB over {len(rss)} samples")
    if getattr(ns, "output_json", None):
        with open(ns.output_json, "w") as f:
            json.dump(data, f, indent=2)
    # Failed requests for `hearth bench`'s exit code: 5xx answers and transport errors.
    failed = sum(v for k, v in data["statuses"].items() if k.startswith("5")) + sum(data["client_errors"].values())
    data["runs"] = [{"failed": failed}]
    return data
