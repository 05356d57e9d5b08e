"""hearth on Ray Serve: replicas across machines behind one OpenAI-compatible address (`pip install hearth[ray]`).

`hearth serve MODEL --ray --num-replicas N` from the command line, or `serve.run(hearth.ray.build_app(MODEL, ...))`.
"""
from hearth.ray.app import build_app

__all__ = ["build_app"]
