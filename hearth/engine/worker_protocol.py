"""The messages between ProcessEngine (the front) and engine_worker (its process), pickled over a Pipe.

Front to worker: AddRequests, AbortRequests, StopSequences, CheckStructured, AddLoRA, RemoveLoRA, RenderMetrics,
Shutdown. Worker to front: Ready or LoadFailed once, then Accepted (per AddRequests), Outputs (once per engine step),
Stats (when they change), StructuredChecked, LoRAAdded and Metrics (per ask).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    from hearth.engine.llm_engine import EngineStats
    from hearth.engine.output_processor import StopRequest
    from hearth.engine.outputs import StepOutput
    from hearth.engine.protocol import EngineInfo, EngineRequest
    from hearth.lora.request import LoRARequest
    from hearth.structured.params import StructuredOutputsParams

STREAM_END = "end"  # an Outputs item: the stream's last output has been sent (identity does not survive pickling)


@dataclass
class AddRequests:
    sid: int  # the front's stream id: the worker tags this stream's outputs with it
    requests: list[EngineRequest]


@dataclass
class AbortRequests:
    request_ids: list[str]


@dataclass
class StopSequences:
    stops: list[StopRequest]  # the stop strings the front's output processor found


@dataclass
class CheckStructured:
    qid: int
    spec: StructuredOutputsParams


@dataclass
class AddLoRA:
    qid: int
    lora: LoRARequest


@dataclass
class RemoveLoRA:
    lora_id: int


@dataclass
class RenderMetrics:
    qid: int


@dataclass
class Shutdown:
    timeout: float


@dataclass
class Ready:
    info: EngineInfo


@dataclass
class LoadFailed:
    message: str


@dataclass
class Accepted:
    sid: int
    error: BaseException | None  # ValueError / QueueFullError / EngineDeadError: the front re-raises it


@dataclass
class Outputs:
    # (sid, the step's outputs | STREAM_END | the error that ended the stream), for every stream the step touched
    items: list[tuple[int, list[StepOutput] | str | BaseException]]


@dataclass
class Stats:
    stats: EngineStats


@dataclass
class StructuredChecked:
    qid: int
    error: ValueError | None  # the constraint's compile error (a 400 naming the field that asked for it)


@dataclass
class LoRAAdded:
    qid: int
    error: Exception | None  # the LoRAError (or other failure) adding it raised


@dataclass
class Metrics:
    qid: int
    text: bytes


ToWorker = Union[AddRequests, AbortRequests, StopSequences, CheckStructured, AddLoRA, RemoveLoRA, RenderMetrics,
                 Shutdown]
ToFront = Union[Ready, LoadFailed, Accepted, Outputs, Stats, StructuredChecked, LoRAAdded, Metrics]
