"""PoolingParams: what a pooling request (embed, score) asks of the engine instead of SamplingParams."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PoolingParams:
    """task: "embed" (a vector per input) or "score" (a cross-encoder's relevance for a text pair).

    dimensions: keep the first N values of the embedding (Matryoshka models only), renormalized when normalized.
    token_type_ids: the segment of each prompt token (BERT text pairs); None: all segment 0.
    """

    task: str = "embed"
    normalize: bool | None = None  # None: as the checkpoint's pooling config says
    dimensions: int | None = None
    token_type_ids: list[int] | None = None
    # Always one sequence: the engine's bookkeeping counts a request's sequences as params.n.
    n: int = 1

    def __post_init__(self) -> None:
        if self.task not in ("embed", "score"):
            raise ValueError(f"pooling task must be embed or score, got {self.task!r}")
        if self.dimensions is not None and self.dimensions < 1:
            raise ValueError(f"dimensions must be >= 1, got {self.dimensions}")
