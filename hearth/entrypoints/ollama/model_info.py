"""What Ollama's listings (/api/tags, /api/ps, /api/show) say about the served model."""
from __future__ import annotations

import hashlib
import os
import time
from datetime import UTC, datetime
from typing import Any

from hearth.entrypoints.openai.errors import APIError
from hearth.entrypoints.openai.serving_common import ServingContext


class ModelInfo:
    """What the listings say about the served model (read once: sizes of a folder need a walk)."""

    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx
        name = ctx.model_name
        self.name = name if ":" in name else f"{name}:latest"
        path = ctx.model_path
        files = [path] if os.path.isfile(path) else [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
        self.size = sum(os.path.getsize(f) for f in files if os.path.exists(f))
        mtime = max((os.path.getmtime(f) for f in files if os.path.exists(f)), default=time.time())
        self.modified_at = datetime.fromtimestamp(mtime, UTC).isoformat().replace("+00:00", "Z")
        # NOTE: not a hash of the weights (hashing GBs at start-up is not worth it): of the path, size and time
        self.digest = hashlib.sha256(f"{path}:{self.size}:{mtime}".encode()).hexdigest()
        mc = ctx.engine.engine.model_config
        self.family = str(mc.hf_config.get("model_type") or mc.architecture)
        self.format = "gguf" if mc.is_gguf else "safetensors"

    def accepts(self, name: str | None) -> bool:
        return name in (None, "", self.ctx.model_name, self.name)

    def check(self, name: str | None) -> None:
        if not self.accepts(name):
            raise APIError(404, f"model '{name}' not found; this server serves '{self.name}'")

    def details(self) -> dict[str, Any]:
        return {"parent_model": "", "format": self.format, "family": self.family, "families": [self.family],
                "parameter_size": "", "quantization_level": ""}

    def entry(self) -> dict[str, Any]:
        return {"name": self.name, "model": self.name, "modified_at": self.modified_at, "size": self.size,
                "digest": self.digest, "details": self.details()}
