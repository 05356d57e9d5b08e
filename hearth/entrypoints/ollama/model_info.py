"""What Ollama's listings (/api/tags, /api/ps, /api/show) say about a served model."""
from __future__ import annotations

import hashlib
import os
import time
from datetime import UTC, datetime
from typing import Any

from hearth.entrypoints.openai.serving_common import ServingContext


def ollama_name(name: str) -> str:
    """Ollama's clients name models `name:tag`; a hearth name without a tag is `name:latest`."""
    return name if ":" in name else f"{name}:latest"


class ModelInfo:
    """A model's file facts (read once: sizes of a folder need a walk) and what its loaded context says."""

    def __init__(self, name: str, path: str) -> None:
        self.name = ollama_name(name)
        files = [path] if os.path.isfile(path) else [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
        self.size = sum(os.path.getsize(f) for f in files if os.path.exists(f))
        mtime = max((os.path.getmtime(f) for f in files if os.path.exists(f)), default=time.time())
        self.modified_at = datetime.fromtimestamp(mtime, UTC).isoformat().replace("+00:00", "Z")
        # NOTE: not a hash of the weights (hashing GBs at start-up is not worth it): of the path, size and time
        self.digest = hashlib.sha256(f"{path}:{self.size}:{mtime}".encode()).hexdigest()
        self.format = "gguf" if path.endswith(".gguf") else "safetensors"

    @staticmethod
    def family(ctx: ServingContext | None) -> str:
        """The model type, known once the model is loaded ("" before)."""
        if ctx is None:
            return ""
        hf = ctx.hf_config or {}
        return str(hf.get("model_type") or (hf.get("architectures") or [""])[0])

    def details(self, ctx: ServingContext | None) -> dict[str, Any]:
        family = self.family(ctx)
        return {"parent_model": "", "format": self.format, "family": family, "families": [family] if family else [],
                "parameter_size": "", "quantization_level": ""}

    def entry(self, ctx: ServingContext | None) -> dict[str, Any]:
        return {"name": self.name, "model": self.name, "modified_at": self.modified_at, "size": self.size,
                "digest": self.digest, "details": self.details(ctx)}
