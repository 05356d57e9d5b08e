"""One loop over a chat request's engine outputs, for the APIs that reshape chat answers (Responses, Anthropic
Messages, Ollama), streamed or whole: chat deltas as they form, and the counts their usage fields need."""
from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Request

from hearth.engine.async_engine import EngineDeadError, RequestStream
from hearth.entrypoints.openai.errors import APIError
from hearth.entrypoints.openai.serving_chat import ChoiceStream
from hearth.entrypoints.openai.serving_common import Guarded


@dataclass
class Tally:
    """What an answer's usage and stop fields need, counted while it runs."""
    keep_ids: bool = False  # collect the output token ids (Ollama's `context`)
    text: str = ""
    n_out: int = 0
    cached: int = 0  # prompt tokens read from the prefix cache
    reason: str | None = None  # the engine's finish reason
    stop: int | str | None = None  # the stop string or token that ended it
    first_at: float | None = None  # time.monotonic() of the first output
    out_ids: list[int] = field(default_factory=list)
    aborted: bool = False  # the client went away (nobody reads the rest)


async def drive(stream: RequestStream, raw: Request, tally: Tally,
                cs: ChoiceStream | None = None) -> AsyncIterator[tuple[dict, bool, str | None]]:
    """Run one engine request to its end, watching the client. Yields (delta, finished, finish_reason) per output:
    the chat delta from `cs` (reasoning, content, tool calls; without one, the plain text as content) and, once
    finished, the finish reason (tool calls mapped by `cs`). The whole text and the counts go into `tally`.
    An engine that fails mid-way is an APIError (a worker process that died: 503)."""
    try:
        async with Guarded(raw, stream) as outputs:
            async for out in outputs:
                tally.text += out.new_text
                tally.n_out += len(out.new_token_ids)
                tally.cached = max(tally.cached, out.num_cached_tokens)
                if tally.keep_ids:
                    tally.out_ids += out.new_token_ids
                if tally.first_at is None:
                    tally.first_at = time.monotonic()
                reason = None
                if out.finished:
                    tally.reason, tally.stop = out.finish_reason, out.stop_reason
                    reason = cs.finish_reason(out.finish_reason) if cs is not None else out.finish_reason
                delta = cs.delta(out.new_text, out.finished) if cs is not None else {"content": out.new_text}
                yield delta, out.finished, reason
    except EngineDeadError as e:
        raise APIError(getattr(e, "status_code", 500), str(e), "server_error", code="engine_dead") from None
    tally.aborted = stream.aborted


async def run_whole(stream: RequestStream, raw: Request, tally: Tally) -> Tally:
    """The non-streaming use: run to the end; the answer is in tally.text (tally.aborted: nobody is listening)."""
    async for _ in drive(stream, raw, tally):
        pass
    return tally
