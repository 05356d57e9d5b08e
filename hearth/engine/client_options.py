"""The one assembly of the in-process client: metrics + AsyncEngine around a loaded LLMEngine, with the options
every deployment mode passes the same way (`hearth serve`, an engine worker process, a Ray replica)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hearth.engine.async_engine import AsyncEngine
    from hearth.engine.llm_engine import LLMEngine


@dataclass
class ClientOptions:
    """--max-waiting-requests and --refill-wait-ms (as seconds): what AsyncEngine takes beside the engine."""
    max_waiting_requests: int | None = None
    refill_wait_s: float = 0.0

    def __post_init__(self) -> None:
        if self.max_waiting_requests is not None and self.max_waiting_requests < 0:
            raise ValueError(f"--max-waiting-requests must be >= 0, got {self.max_waiting_requests}")
        if self.refill_wait_s < 0:
            raise ValueError(f"--refill-wait-ms must be >= 0, got {self.refill_wait_s * 1000:g}")


def build_client(llm: LLMEngine, opts: ClientOptions, model_name: str | None = None,
                 engine_label: str = "0") -> AsyncEngine:
    """The in-process client with its own metrics registry (model_name: the metrics' label, default the served
    name; engine_label: vLLM's `engine` label, the data-parallel rank). Not started: call start()."""
    from hearth.engine.async_engine import AsyncEngine
    from hearth.metrics import ServerMetrics

    mc = llm.model_config
    metrics = ServerMetrics(model_name or mc.served_model_name, max_model_len=mc.max_model_len,
                            engine=engine_label)
    return AsyncEngine(llm, metrics, opts.max_waiting_requests, opts.refill_wait_s)
