"""hearth on Ray Serve: a local Ray started here (2 CPUs, no dashboard), 2 model replicas of 1 CPU each behind the
ingress, driven with the official openai client; then one replica actor is killed and Ray Serve replaces it."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.server.conftest import free_port, wait_until

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

pytestmark = pytest.mark.slow
KEY = "ray-test-key"
APP = "hearth"
REPLICA_ACTOR = "SERVE_REPLICA::hearth#HearthModel#"


class RayApp:
    def __init__(self, url: str, startup_s: float) -> None:
        self.url, self.startup_s = url, startup_s

    def client(self, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=120)


def _replica_tags() -> set[str]:
    return {a["name"].removeprefix(REPLICA_ACTOR) for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith(REPLICA_ACTOR)}


def _model_running() -> bool:
    status = serve.status().applications.get(APP)
    if status is None:
        return False
    dep = status.deployments["HearthModel"]
    return str(dep.status).endswith("HEALTHY") and dep.replica_states.get("RUNNING", 0) == 2


KEY_FILE = f"""admin_key = "{KEY}"
[[keys]]
name = "limited"
key = "ray-limited"
requests_per_minute = 2
models = ["tiny"]
[[keys]]
name = "quota"
key = "ray-quota"
tokens_per_day = 8
[[keys]]
name = "racer"
key = "ray-racer"
tokens_per_day = 8
"""


@pytest.fixture(scope="module")
def ray_app(tiny_model: str, tmp_path_factory) -> Iterator[RayApp]:
    import hearth.ray
    from hearth.entrypoints.openai.gateway import GatewayConfig, read_blocklist

    files = tmp_path_factory.mktemp("ray-conf")
    (files / "keys.toml").write_text(KEY_FILE)
    (files / "blocklist.txt").write_text("forbidden-\\w+\n")

    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 1024 * 1024, log_to_driver=False)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        gateway = GatewayConfig(blocklist=read_blocklist(str(files / "blocklist.txt")), answer_cache_size=16)
        serve.run(hearth.ray.build_app(tiny_model, num_replicas=2, num_cpus_per_replica=1, kv_cache_space=0.05,
                                       api_key_file=str(files / "keys.toml"), gateway=gateway),
                  name=APP, route_prefix="/")
        app = RayApp(f"http://127.0.0.1:{port}", 0.0)
        app.client().completions.create(model="tiny", prompt="hi", max_tokens=1)
        app.startup_s = time.perf_counter() - t0
        print(f"\nRay start-up to first answer: {app.startup_s:.1f} s")
        yield app
    finally:
        serve.shutdown()
        ray.shutdown()


def _chat(client: openai.OpenAI, i: int):
    return client.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": f"request {i}"}], max_tokens=6, temperature=0.0,
        extra_body={"ignore_eos": True})


def test_replicas_share_requests_errors_metrics(ray_app: RayApp) -> None:
    client = ray_app.client()
    with ThreadPoolExecutor(8) as pool:
        raws = list(pool.map(lambda i: _chat(client, i), range(16)))
    assert all(r.http_response.status_code == 200 for r in raws)
    assert all(r.parse().usage.completion_tokens == 6 for r in raws)
    served_by = {r.headers["x-hearth-replica"] for r in raws}
    assert served_by == _replica_tags() and len(served_by) == 2

    chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "stream"}],
                                                 max_tokens=5, stream=True, extra_body={"ignore_eos": True}))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"

    with pytest.raises(openai.AuthenticationError):
        ray_app.client("wrong").models.list()
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="hi", temperature=-1)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="hi")

    def both_in_metrics() -> bool:
        text = httpx.get(ray_app.url + "/metrics", timeout=10).text
        return all(f'engine="{tag}"' in text for tag in served_by)

    assert wait_until(both_in_metrics, timeout=20)
    text = httpx.get(ray_app.url + "/metrics", timeout=10).text
    assert 'vllm:request_success_total{engine="' in text


def _metric_sum(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rpartition(" ")[2])
    return total


def test_client_gone_mid_stream_aborts_on_the_replica(ray_app: RayApp) -> None:
    body = {"model": "tiny", "prompt": "a long answer", "max_tokens": 200, "stream": True, "ignore_eos": True}
    headers = {"authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=ray_app.url, timeout=30) as http, \
            http.stream("POST", "/v1/completions", json=body, headers=headers) as r:
        assert r.status_code == 200
        next(r.iter_lines())

    def aborted_and_idle() -> bool:
        text = httpx.get(ray_app.url + "/metrics", timeout=10).text
        return (_metric_sum(text, "vllm:request_success_total", finished_reason="abort") >= 1
                and _metric_sum(text, "vllm:num_requests_running") == 0
                and _metric_sum(text, "hearth:kv_cache_used_blocks") == 0)

    assert wait_until(aborted_and_idle, timeout=30, interval=0.5)


def test_key_file_limits_and_gateway_flags(ray_app: RayApp) -> None:
    """--api-key-file's limits at the ingress (the replicas report each request's tokens back) and the gateway's
    blocklist and answer cache in the replicas, as under hearth serve."""
    limited, quota = ray_app.client("ray-limited"), ray_app.client("ray-quota")
    with pytest.raises(openai.PermissionDeniedError, match="may not use the model 'other'"):
        limited.completions.create(model="other", prompt="hi", max_tokens=1)
    # NOTE: the refusal (in the replica's model_access) came after the ingress counted the request: one more
    limited.completions.create(model="tiny", prompt="hi", max_tokens=1)
    with pytest.raises(openai.RateLimitError, match="requests_per_minute = 2"):
        limited.completions.create(model="tiny", prompt="hi", max_tokens=1)
    # The replica holds a request's most tokens (prompt + n x max_tokens) against what is left of the key's
    # quota, as hearth serve does: one that could go past it is refused before it runs (issue 44).
    with pytest.raises(openai.RateLimitError, match="may use up to 9 tokens .* key 'quota' has 8"):
        quota.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=6)
    used = quota.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=4, extra_body={"ignore_eos": True})
    assert used.usage.total_tokens == 7
    with pytest.raises(openai.RateLimitError, match="may use up to 3 tokens .* key 'quota' has 1"):
        quota.completions.create(model="tiny", prompt=[5, 6], max_tokens=1)
    # Two requests at once that fit one at a time: the second leaves only once the first holds its tokens, so
    # exactly one runs (each replica saw the same allowance before; both ran).
    async def race() -> list[int]:
        racer = openai.AsyncOpenAI(base_url=ray_app.url + "/v1", api_key="ray-racer", max_retries=0, timeout=120)
        jobs = [racer.completions.with_raw_response.create(model="tiny", prompt=[5], max_tokens=4) for _ in range(2)]
        outs = await asyncio.gather(*jobs, return_exceptions=True)
        return sorted(getattr(o, "status_code", 0) for o in outs)

    assert asyncio.run(race()) == [200, 429]  # (the refused one raised RateLimitError, status 429)
    usage = {k["name"]: k for k in httpx.get(ray_app.url + "/keys/usage", timeout=10,
                                             headers={"authorization": f"Bearer {KEY}"}).json()["data"]}
    assert usage["quota"]["usage"]["tokens_today"] == 7 and usage["limited"]["usage"]["requests"] == 2
    assert usage["racer"]["usage"]["tokens_reserved"] == 0 and usage["racer"]["usage"]["tokens_today"] <= 5

    client = ray_app.client()
    with pytest.raises(openai.BadRequestError):  # the blocklist, checked in the replica
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a forbidden-word"}],
                                       max_tokens=2)
    client.completions.create(model="tiny", prompt="cache me", max_tokens=2, temperature=0.0)
    text = httpx.get(ray_app.url + "/metrics", timeout=10).text
    assert wait_until(lambda: _metric_sum(httpx.get(ray_app.url + "/metrics", timeout=10).text,
                                          "hearth:answer_cache_queries_total") >= 1, timeout=20), text


def test_killed_replica_is_replaced(ray_app: RayApp) -> None:
    before = _replica_tags()
    victim = sorted(before)[0]
    ray.kill(ray.get_actor(REPLICA_ACTOR + victim, namespace="serve"), no_restart=True)
    assert wait_until(lambda: victim not in _replica_tags() and len(_replica_tags()) == 2 and _model_running(),
                      timeout=180, interval=0.5), serve.status()
    client = ray_app.client()
    with ThreadPoolExecutor(4) as pool:
        raws = list(pool.map(lambda i: _chat(client, i), range(8)))
    assert all(r.http_response.status_code == 200 for r in raws)
    assert victim not in {r.headers["x-hearth-replica"] for r in raws}
