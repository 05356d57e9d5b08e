"""`hearth keys usage` (a running server's per-key usage, with the admin key) and `hearth keys new NAME`
(a fresh key as a [[keys]] entry to paste into the --api-key-file)."""
from __future__ import annotations

import argparse
import json
import secrets
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("keys", help="per-user API keys: usage of a running server, new keys",
                       description="Per-user API keys (hearth serve --api-key-file FILE).")
    ks = p.add_subparsers(dest="keys_command", required=True)
    u = ks.add_parser("usage", help="requests and tokens per key on a running server (needs the admin key)")
    u.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default %(default)s)")
    u.add_argument("--api-key", default=None, help="the admin key (env HEARTH_API_KEY / VLLM_API_KEY)")
    u.add_argument("--json", action="store_true", help="print the server's JSON instead of a table")
    u.set_defaults(func=run_usage)
    n = ks.add_parser("new", help="print a new random key as a [[keys]] TOML entry")
    n.add_argument("name", help="who the key is for")
    n.set_defaults(func=run_new)


def _limit(value: object) -> str:
    return "-" if value is None else ",".join(value) if isinstance(value, list) else str(value)


def format_usage(rows: list[dict]) -> str:
    head = ["NAME", "REQUESTS", "PROMPT TOKENS", "COMPLETION TOKENS", "TOKENS TODAY", "IN FLIGHT",
            "REQ/MIN", "TOKENS/DAY", "CONCURRENT", "MODELS"]
    table = [head]
    for r in rows:
        u, lim = r["usage"], r["limits"]
        table.append([r["name"] + (" (admin)" if r["admin"] else ""), str(u["requests"]), str(u["prompt_tokens"]),
                      str(u["completion_tokens"]), str(u["tokens_today"]), str(u["in_flight"]),
                      _limit(lim["requests_per_minute"]), _limit(lim["tokens_per_day"]),
                      _limit(lim["max_concurrent_requests"]), _limit(lim["models"])])
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table)


def run_usage(ns: argparse.Namespace) -> int:
    import httpx

    from hearth import envs

    key = ns.api_key or envs.api_key()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        r = httpx.get(ns.url.rstrip("/") + "/keys/usage", headers=headers, timeout=10)
    except httpx.HTTPError as e:
        raise ValueError(f"cannot reach {ns.url}: {e}; is `hearth serve` running there (--url)?") from None
    if r.status_code in (401, 403):
        raise ValueError(f"{ns.url} refused the key ({r.status_code}): pass the admin key with --api-key "
                         "or HEARTH_API_KEY")
    if r.status_code != 200:
        raise ValueError(f"{ns.url}/keys/usage answered {r.status_code}: {r.text[:200]}")
    rows = r.json()["data"]
    print(json.dumps(rows, indent=2) if ns.json else format_usage(rows))
    return 0


def run_new(ns: argparse.Namespace) -> int:
    sys.stdout.write(f'[[keys]]\nname = {json.dumps(ns.name)}\nkey = "sk-{secrets.token_urlsafe(24)}"\n'
                     "# requests_per_minute = 20\n# tokens_per_day = 100000\n# max_concurrent_requests = 2\n"
                     '# models = ["SmolLM2-135M-Instruct"]\n')
    return 0
