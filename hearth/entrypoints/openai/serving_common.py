"""What every generating endpoint shares: the model check, submitting to the engine, disconnect handling, SSE."""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from fastapi import Request

from hearth.engine.async_engine import EngineDeadError, QueueFullError, RequestStream, ShutdownError
from hearth.engine.outputs import StepOutput
from hearth.engine.protocol import EngineClient, EngineRequest, engine_requests
from hearth.entrypoints.openai.token_quota import meter, reserve, tokens_needed
from hearth.entrypoints.openai.chat_images import ChatImages
from hearth.entrypoints.openai.errors import APIError, bad_request, error_body
from hearth.entrypoints.openai.template_sandbox import SandboxRenderer
from hearth.entrypoints.openai.fim import FIMTokens, find_fim_tokens
from hearth.lora.request import LoRARequest
from hearth.entrypoints.openai.reasoning_parser import THINK_CLOSE, THINK_OPEN, ReasoningParser
from hearth.sampling_params import SamplingParams
from hearth.structured.params import StructuredOutputsParams
from hearth.structured.reasoning import ReasoningParams
from hearth.tokenizer import Tokenizer

# Parameter names a SamplingParams / engine message may start with (its first word names the field).
SAMPLING_PARAMS = {"n", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                   "repetition_penalty", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs", "seed", "stop",
                   "logit_bias", "top_logprobs", "max_completion_tokens", "messages", "prompt",
                   "stop_token_ids", "priority"}


GRAMMAR_TIMEOUT_S = 5.0


@dataclass
class ServingContext:
    engine: EngineClient
    tokenizer: Tokenizer
    model_name: str
    model_path: str
    max_model_len: int
    aliases: tuple[str, ...] = ()  # other names a request may use (--models-config)
    reasoning_parser: ReasoningParser | None = None  # --reasoning-parser
    reasoning_budget: int | None = None  # --reasoning-budget
    # The LoRA adapter this context's requests run under (a request named it as its model: lora_adapters.py)
    lora: LoRARequest | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    _token_texts: dict[int, str] = field(default_factory=dict)  # bounded by the vocabulary
    sandbox: SandboxRenderer = field(default_factory=SandboxRenderer)  # request-supplied chat templates

    @property
    def max_prompt_chars(self) -> int:
        """The limit on a rendered chat prompt: far more text than the context can hold in tokens."""
        return max(1_000_000, 32 * self.max_model_len)

    @property
    def sampling_defaults(self) -> dict:
        """The engine's generation_config defaults for fields a request leaves unset (generation_defaults.py)."""
        return self.engine.info.generation_defaults or {}

    @property
    def hf_config(self):
        """The model's HF config (hearth.config.HFConfig, a dict)."""
        return self.engine.info.hf_config

    @functools.cached_property
    def images(self) -> ChatImages:
        """The model's image handling (chat image_url parts), built on first use."""
        info = self.engine.info
        return ChatImages(self.model_name, self.model_path, self.hf_config, info.mm_limits or {},
                          info.media_domains or [])

    @functools.cached_property
    def fim(self) -> FIMTokens | None:
        """The model's fill-in-the-middle tokens (None: it has none), found on first use."""
        return find_fim_tokens(self.tokenizer, self.hf_config)

    def check_model(self, name: str | None) -> None:
        # NOTE: an absent model is accepted (vLLM does the same); a wrong one is a 404.
        if name is not None and name != self.model_name and name not in self.aliases:
            raise APIError(404, f"the model {name!r} does not exist; this server serves {self.model_name!r}",
                           param="model", code="model_not_found")

    def check_reasoning(self) -> None:
        """--reasoning-budget needs a parser and a single </think> token to force (a one-line CLI error)."""
        if self.reasoning_budget is None:
            return
        if self.reasoning_parser is None:
            raise ValueError("--reasoning-budget needs --reasoning-parser (qwen3 or deepseek_r1)")
        if self.reasoning_budget < 0:
            raise ValueError(f"--reasoning-budget must be >= 0, got {self.reasoning_budget}")
        if self.tokenizer.backend.token_to_id(THINK_CLOSE) is None:
            raise ValueError(f"--reasoning-budget: this model's vocabulary has no {THINK_CLOSE} token to end the "
                             "thinking with; drop the flag")

    def reasoning_params(self, params: SamplingParams, state: str, budget: int | None = None) -> SamplingParams:
        """Thinking comes before the grammar; the budget (the request's, else --reasoning-budget) forces its end.
        Plain requests without a budget need neither (their text is split after the fact)."""
        budget = self.reasoning_budget if budget is None else budget
        end = self.tokenizer.backend.token_to_id(THINK_CLOSE)
        if end is None or (budget is None and params.structured_outputs is None):
            return params
        start = self.tokenizer.backend.token_to_id(THINK_OPEN) if state == "before" else None
        return dataclasses.replace(params, reasoning=ReasoningParams(end, start, state == "think", budget))

    def token_text(self, token_id: int) -> str:
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    async def compile_structured(self, spec: StructuredOutputsParams | None, param: str | None) -> None:
        """Compile (and cache) a constraint where the engine runs, before submitting: a bad one is a 400 naming the
        field that asked for it (a worker's engine compiles it on admission instead: then generate() says so)."""
        if spec is None:
            return
        try:
            # NOTE: a compile past the limit goes on in its thread (it cannot be stopped), bounded by the
            # compiler's size limit; the request is refused at once, so it never reaches the engine.
            await asyncio.wait_for(self.engine.check_structured(spec), GRAMMAR_TIMEOUT_S)
        except TimeoutError:
            raise APIError(400, f"{param}: the constraint took longer than the limit of {GRAMMAR_TIMEOUT_S:g} s "
                                "to compile", param=param) from None
        except ValueError as e:
            raise APIError(400, f"{param}: {e}" if param else str(e), param=param) from None

    async def generate(self, subs: Sequence[EngineRequest], prompt_param: str = "prompt") -> RequestStream:
        """Submit; user errors become 400 (param: the field at fault; prompt_param names the prompt's field), a
        full queue 503 with Retry-After."""
        subs = engine_requests(subs)
        if self.lora is not None:
            subs = [dataclasses.replace(s, lora_request=self.lora) for s in subs]
        # The request's API key holds what it may use before it runs (a 429 when that is over its quota)
        charge, stream = reserve(tokens_needed(subs, self.max_model_len)), None
        try:
            stream = meter(await self.engine.generate(subs), subs, charge)  # counts what it uses as it runs
            return stream
        except ValueError as e:  # (a ParamError names its field; "prompt" is this API's prompt_param)
            err = bad_request(e, SAMPLING_PARAMS | {"dimensions"})
            if err.param == "prompt":
                err.param = prompt_param
            raise err from None
        except QueueFullError as e:
            raise APIError(503, str(e), "server_overloaded", code="queue_full",
                           headers={"Retry-After": str(e.retry_after)}) from None
        except EngineDeadError as e:  # a worker process that died is a 503 (WorkerDiedError.status_code)
            raise APIError(getattr(e, "status_code", 500), str(e), "server_error") from None
        finally:
            if stream is None and charge is not None:  # never submitted: nothing of the hold was used
                charge.close()


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def sse(obj: dict | str) -> str:
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n"


async def wait_disconnect(raw: Request) -> None:
    """Return when the client has gone away (call after the body was read)."""
    while (await raw.receive()).get("type") != "http.disconnect":
        pass


async def _watch_disconnect(raw: Request, stream: RequestStream) -> None:
    """Abort the stream the moment the client goes away (frees its KV blocks at once)."""
    while True:
        message = await raw.receive()
        if message.get("type") == "http.disconnect":
            stream.abort()
            return


class Guarded:
    """Iterates a RequestStream while watching the connection; always aborts what is unfinished at the end.

    `async with Guarded(raw, stream) as outputs: async for out in outputs: ...`
    """

    def __init__(self, raw: Request, stream: RequestStream) -> None:
        self.raw, self.stream = raw, stream
        self._watcher: asyncio.Task | None = None

    async def __aenter__(self) -> AsyncIterator[StepOutput]:
        self._watcher = asyncio.create_task(_watch_disconnect(self.raw, self.stream))
        return aiter(self.stream)

    async def __aexit__(self, *exc: object) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        self.stream.abort()  # NOTE: a no-op when the stream ended normally

    @property
    def aborted(self) -> bool:
        return self.stream.aborted


async def sse_stream(chunks: AsyncIterator[str]) -> AsyncIterator[str]:
    """Wrap an SSE generator: an engine failure mid-stream becomes an error event, then [DONE]."""
    try:
        async for chunk in chunks:
            yield chunk
    except APIError as e:
        yield sse(error_body(e.message, e.type, e.param, e.code))
    except EngineDeadError as e:
        yield sse(error_body(str(e), "server_error"))
    except ShutdownError as e:
        yield sse(error_body(str(e), "server_error", None, "server_shutting_down"))
    yield "data: [DONE]\n\n"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    out = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out
