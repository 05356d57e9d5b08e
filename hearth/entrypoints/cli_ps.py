"""`hearth ps`: the models a running `hearth serve --models-dir/--models-config` offers, like `ollama ps`."""
from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ps", help="list a running server's models and their state",
                       description="List a running hearth server's models (GET /models): NAME, SIZE, STATE, "
                                   "CONTEXT, IDLE FOR.")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default %(default)s)")
    p.add_argument("--api-key", default=None, help="the server's key (env HEARTH_API_KEY)")
    p.set_defaults(func=run_ps)


def _size(n: int) -> str:
    return f"{n / 1024 ** 3:.1f} GB" if n >= 1024 ** 3 else f"{n / 1024 ** 2:.0f} MB"


def _idle(entry: dict) -> str:
    if entry["state"] != "loaded":
        return "-"
    s = entry["idle_seconds"]
    if s is None:
        return "busy"
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min"


def format_table(models: list[dict]) -> str:
    rows = [("NAME", "SIZE", "STATE", "CONTEXT", "IDLE FOR")]
    for m in models:
        rows.append((m["name"], _size(m["size_bytes"]), m["state"] + (" (pinned)" if m["pinned"] else ""),
                     str(m["max_model_len"] or "-"), _idle(m)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def run_ps(ns: argparse.Namespace) -> int:
    import httpx

    from hearth import envs

    key = ns.api_key or envs.api_key() or envs.openai_api_key()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        r = httpx.get(ns.url.rstrip("/") + "/models", headers=headers, timeout=10)
    except httpx.HTTPError as e:
        raise ValueError(f"cannot reach {ns.url} ({e}): start `hearth serve --models-dir DIR` or pass --url") from None
    if r.status_code == 404:
        raise ValueError(f"{ns.url} serves one model, without /models: `hearth ps` needs --models-dir, "
                         "--models-config or --data-parallel-size")
    if r.status_code == 401:
        raise ValueError(f"{ns.url} needs an API key: pass --api-key")
    r.raise_for_status()
    print(format_table(r.json()["data"]))
    return 0
