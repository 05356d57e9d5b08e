"""The gateway's flags, apart from gateway.py so `hearth serve --help` does not import the server (and torch)."""
from __future__ import annotations

import argparse


def add_gateway_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("gateway")
    g.add_argument("--upstream", default=None, metavar="URL",
                   help="an OpenAI-compatible server (e.g. vLLM on GPUs, http://gpu:8000/v1) that gets requests "
                        "for models this server does not serve, and long prompts (--upstream-min-prompt-tokens)")
    g.add_argument("--upstream-api-key", default=None,
                   help="sent to the upstream as 'Authorization: Bearer <key>' (env HEARTH_UPSTREAM_API_KEY)")
    g.add_argument("--upstream-model", default=None,
                   help="model name to ask the upstream for when a request for the local model goes there for its "
                        "length (default: the same name)")
    g.add_argument("--upstream-min-prompt-tokens", type=int, default=None,
                   help="forward requests for the local model whose prompt has at least this many tokens "
                        "(default: serve them all locally)")
    g.add_argument("--upstream-timeout", type=float, default=600.0,
                   help="seconds to wait for the upstream's next bytes (default %(default)s)")
    g.add_argument("--blocklist", default=None, metavar="FILE",
                   help="file of regular expressions, one a line (case-insensitive; # comments): prompts that "
                        "match one are refused with a 400")
    g.add_argument("--answer-cache-size", type=int, default=0,
                   help="keep the answers of this many repeatable requests (temperature 0 or a seed), LRU "
                        "(default 0: off)")
    g.add_argument("--answer-cache-ttl", type=float, default=600.0,
                   help="seconds an answer stays in the answer cache (default %(default)s)")
