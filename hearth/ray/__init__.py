"""hearth on Ray Serve: replicas across machines behind one OpenAI-compatible address (`pip install hearth[ray]`).

`hearth serve MODEL --ray --num-replicas N` from the command line, or `serve.run(hearth.ray.build_app(MODEL, ...))`.
"""
from __future__ import annotations

from typing import Any

__all__ = ["build_app"]


def __getattr__(name: str) -> Any:
    # NOTE: lazy, so hearth.ray.plan (what `hearth serve --ray` checks its flags with) imports without Ray.
    if name == "build_app":
        from hearth.ray.app import build_app

        return build_app
    raise AttributeError(f"module 'hearth.ray' has no attribute {name!r}")
