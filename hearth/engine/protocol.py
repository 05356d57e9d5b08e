"""EngineClient: the one interface the serving layer talks to, whatever runs the engine (vLLM's
`engine/protocol.py`). Implemented by AsyncEngine (in process), ProcessEngine (a worker process) and
DataParallelEngine (N worker processes); the two worker clients also implement WorkerEngineClient (load, kill,
render_metrics). The ModelRouter answers /health with the same dead / stats for several models.

Also the typed messages that cross it: EngineRequest (one generate submission) and EngineInfo (what the serving
layer needs to know about the loaded model, produced the same way in process and by a worker).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from hearth.engine.async_engine import RequestStream
    from hearth.engine.llm_engine import EngineStats, LLMEngine
    from hearth.engine.output_processor import StopRequest
    from hearth.lora.request import LoRARequest
    from hearth.metrics import ServerMetrics
    from hearth.multimodal.inputs import ImageInput
    from hearth.pooling_params import PoolingParams
    from hearth.sampling_params import SamplingParams
    from hearth.structured.params import StructuredOutputsParams


@dataclass
class EngineRequest:
    """One engine request: its id, its prompt's token ids, its parameters (sampling or pooling) and the LoRA adapter
    it runs under (None: the base model)."""
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams | PoolingParams
    lora_request: LoRARequest | None = None
    mm_inputs: list[ImageInput] | None = None  # the images whose tokens the prompt holds (hearth.multimodal)

    @classmethod
    def of(cls, item: EngineRequest | tuple) -> EngineRequest:
        """Accepts the (request_id, prompt ids, params) tuples callers passed before this type existed."""
        return item if isinstance(item, EngineRequest) else cls(*item)


def engine_requests(items: Sequence[EngineRequest | tuple]) -> list[EngineRequest]:
    return [EngineRequest.of(x) for x in items]


@dataclass
class EngineInfo:
    """What the front needs to serve a loaded model without holding the engine (picklable: a worker sends it)."""
    pid: int
    tokenizer: Any  # hearth.tokenizer.Tokenizer (picklable: a tokenizers backend + a dataclass)
    served_model_name: str
    model_path: str
    max_model_len: int
    threads: int
    bound_cores: list[int]
    num_blocks: int
    kv_bytes: int
    weights_bytes: int
    hf_config: Any = None  # hearth.config.HFConfig (a dict): what the serving layer looks up (FIM tokens)
    generation_defaults: dict = field(default_factory=dict)  # generation_config defaults for unset request fields
    mm_limits: dict = field(default_factory=dict)  # --limit-mm-per-prompt, parsed: {"image": N} ({} : the default)
    media_domains: list = field(default_factory=list)  # --allowed-media-domains

    @classmethod
    def of(cls, llm: LLMEngine) -> EngineInfo:
        mc = llm.model_config
        return cls(os.getpid(), llm.tokenizer, mc.served_model_name, mc.model, mc.max_model_len, llm.threads,
                   list(llm.bound_cores), llm.block_manager.num_usable_blocks, _kv_bytes(llm),
                   _weights_bytes(mc.model), mc.hf_config, dict(getattr(llm, "generation_defaults", None) or {}),
                   dict(getattr(llm, "mm_limits", None) or {}),
                   list(getattr(getattr(llm, "args", None), "allowed_media_domains", None) or []))


@runtime_checkable
class EngineClient(Protocol):
    """What the serving layer calls. Every client returns RequestStream from generate()."""

    metrics: ServerMetrics | None  # the local Prometheus registry; None when the engine's are in worker processes

    @property
    def dead(self) -> BaseException | None:
        """Set once the engine can no longer serve (its loop crashed, its worker exited)."""

    @property
    def stats(self) -> EngineStats:
        """The last snapshot of running / waiting requests and KV use (never blocks on the engine)."""

    @property
    def info(self) -> EngineInfo | None:
        """The loaded model; None until a worker has loaded it."""

    def start(self) -> None:
        """Start serving (in process: the engine thread; worker clients start in load())."""

    def shutdown(self, timeout: float = 30.0) -> None:
        """Let in-flight requests finish (up to timeout), then stop. Blocking."""

    async def generate(self, requests: Sequence[EngineRequest]) -> RequestStream:
        """Queue requests that share one output stream, all or nothing: raises ValueError (a user error),
        QueueFullError or EngineDeadError, and then none of them runs."""

    def abort(self, request_ids: list[str]) -> None:
        """Abort requests (thread-safe, idempotent): their KV blocks are freed before the next step."""

    def stop(self, stops: list[StopRequest]) -> None:
        """Finish sequences at the stop strings the front's output processor found (thread-safe): the engine frees
        their blocks and answers with each one's last output (finish reason "stop")."""

    async def check_structured(self, spec: StructuredOutputsParams) -> None:
        """Compile (and cache) a constraint where the engine runs, off the event loop; ValueError if it is bad.
        A client whose engine compiles at submission (a worker) may return at once: the error comes from
        generate() then."""

    async def add_lora(self, lora: LoRARequest) -> None:
        """Load a LoRA adapter where the engine runs (read off its step loop), so the requests naming it start at
        once; raises LoRAError (a user error naming the cause). A request under an adapter never added loads it
        on admission instead."""

    async def remove_lora(self, lora_id: int) -> None:
        """Forget an adapter; requests in flight under it finish under it."""


@runtime_checkable
class WorkerEngineClient(EngineClient, Protocol):
    """A client whose engine runs in worker processes (ProcessEngine, DataParallelEngine): the front loads it,
    unloads it (kill(), or shutdown() to drain first) and asks its workers for their metrics."""

    async def load(self, timeout: float | None = None) -> EngineInfo:
        """Spawn the worker(s) and wait until the model is loaded (timeout None: the client's own bound, if any).
        Raises LoadFailedError or TimeoutError, and then no worker is left running."""

    def kill(self) -> None:
        """Stop the worker(s) now; their in-flight requests fail with a 503."""

    async def render_metrics(self) -> bytes:
        """The workers' Prometheus exposition (their registries live in their processes)."""


def _weights_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files
                     if f.endswith((".safetensors", ".bin", ".gguf")))
    return total


def _kv_bytes(llm: LLMEngine) -> int:
    import torch

    total = 0
    for obj in getattr(llm.runner, "kv_caches", None) or []:
        for t in obj if isinstance(obj, (list, tuple)) else [obj]:
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total
