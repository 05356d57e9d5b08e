"""Gateway mode: validate every request here, answer repeatable ones from the answer cache, forward the ones for a
model this server does not serve (or with long prompts) to an OpenAI-compatible upstream, serve the rest locally.

The local path is the ordinary one (serving_chat / serving_completion); only the routing decision is made here.
"""
from __future__ import annotations

import argparse
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter

from hearth.entrypoints.openai.gateway_args import add_gateway_args  # noqa: F401 (its flags)
from hearth.entrypoints.openai.api_keys import owner
from hearth.entrypoints.openai.body import aloads
from hearth.entrypoints.openai.answer_cache import AnswerCache, cache_key, repeatable
from hearth.entrypoints.openai.errors import APIError, bad_request, error_body
from hearth.entrypoints.openai.model_access import may_use
from hearth.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from hearth.entrypoints.openai.serving_common import SAMPLING_PARAMS, ServingContext, sse
from hearth.entrypoints.openai.token_quota import (
    Charge,
    charge_now,
    has_quota,
    request_charges,
    reserve,
    settle,
    settled,
    usage_of,
)
from hearth.entrypoints.openai.upstream_check import EventStream, UpstreamAnswerError, check_answer, passes_through

logger = logging.getLogger("hearth")

LocalHandler = Callable[[ServingContext, Any, Request], Awaitable[Response]]
ROUTE_HEADER = "x-hearth-route"  # local | upstream | cache: where an answer came from


@dataclass
class GatewayConfig:
    upstream: str | None = None  # base URL without /v1
    upstream_api_key: str | None = None
    upstream_model: str | None = None  # name to ask the upstream for when a local-model request is forwarded
    upstream_min_prompt_tokens: int | None = None
    upstream_timeout: float = 600.0
    blocklist: list[re.Pattern[str]] = field(default_factory=list)
    answer_cache_size: int = 0
    answer_cache_ttl: float = 600.0

    @property
    def enabled(self) -> bool:
        return self.upstream is not None or bool(self.blocklist) or self.answer_cache_size > 0


def read_blocklist(path: str) -> list[re.Pattern[str]]:
    patterns = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            try:
                patterns.append(re.compile(text, re.IGNORECASE))
            except re.error as e:
                raise ValueError(f"--blocklist {path}:{lineno}: not a regular expression ({e})") from None
    return patterns


def gateway_config_from(ns: argparse.Namespace, upstream_api_key_env: str | None) -> GatewayConfig:
    """Raises ValueError (a one-line CLI error) on bad values."""
    upstream = ns.upstream
    if upstream is not None:
        if not upstream.startswith(("http://", "https://")):
            raise ValueError(f"--upstream must be an http:// or https:// URL, got {upstream!r}")
        upstream = upstream.rstrip("/").removesuffix("/v1")
    for flag, value in (("--upstream-min-prompt-tokens", ns.upstream_min_prompt_tokens),
                        ("--answer-cache-size", ns.answer_cache_size)):
        if value is not None and value < 0:
            raise ValueError(f"{flag} must be >= 0, got {value}")
    for flag, value in (("--answer-cache-ttl", ns.answer_cache_ttl), ("--upstream-timeout", ns.upstream_timeout)):
        if value <= 0:
            raise ValueError(f"{flag} must be > 0, got {value}")
    if upstream is None and (ns.upstream_min_prompt_tokens is not None or ns.upstream_model is not None):
        raise ValueError("--upstream-min-prompt-tokens and --upstream-model need --upstream URL")
    return GatewayConfig(upstream, ns.upstream_api_key or upstream_api_key_env, ns.upstream_model,
                         ns.upstream_min_prompt_tokens, ns.upstream_timeout,
                         read_blocklist(ns.blocklist) if ns.blocklist else [], ns.answer_cache_size,
                         ns.answer_cache_ttl)


def _texts(req: ChatCompletionRequest | CompletionRequest) -> list[str]:
    if isinstance(req, CompletionRequest):
        p = req.prompt
        return [p] if isinstance(p, str) else [x for x in p if isinstance(x, str)]
    out = []
    for m in req.messages:
        if isinstance(m.content, str):
            out.append(m.content)
        elif m.content:
            out.extend(part.text for part in m.content if part.text)
    return out


class Gateway:
    def __init__(self, config: GatewayConfig, ctx: ServingContext, registry: CollectorRegistry) -> None:
        self.config, self.ctx = config, ctx
        self.cache = (AnswerCache(config.answer_cache_size, config.answer_cache_ttl, registry)
                      if config.answer_cache_size > 0 else None)
        self.upstream_requests = Counter("hearth:upstream_requests",
                                         "Requests forwarded to the upstream, by the HTTP status answered "
                                         "(the upstream's, or 502/503 when it gave no valid answer or could not "
                                         "be reached).",
                                         ["status"], registry=registry)
        self._client: httpx.AsyncClient | None = None
        if config.upstream is not None:
            headers = {"authorization": f"Bearer {config.upstream_api_key}"} if config.upstream_api_key else {}
            self._client = httpx.AsyncClient(base_url=config.upstream, headers=headers,
                                             timeout=httpx.Timeout(config.upstream_timeout, connect=5.0))

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def upstream_models(self) -> list[dict[str, Any]]:
        """The upstream's /v1/models entries, so clients see every model they can ask for here; none when it is
        down or answers with something else (the local list still goes out)."""
        if self._client is None:
            return []
        try:
            resp = await self._client.get("/v1/models", timeout=3.0)
            data = resp.json().get("data", []) if resp.status_code == 200 else []
        except (httpx.HTTPError, ValueError, AttributeError):
            return []
        return [m for m in data if isinstance(m, dict) and m.get("id") != self.ctx.model_name]

    async def handle(self, raw: Request, req: ChatCompletionRequest | CompletionRequest,
                     serve_local: LocalHandler) -> Response:
        may_use(req.model)  # (routed here, never through KeyScopedModels: it may go upstream)
        for text in _texts(req):
            if any(p.search(text) for p in self.config.blocklist):
                raise APIError(400, "the request was refused: its prompt matches this server's blocklist",
                               param="prompt" if isinstance(req, CompletionRequest) else "messages",
                               code="content_blocked")
        obj = await aloads(await raw.body())  # NOTE: parse_body already read (and Starlette kept) the body
        key = None
        if self.cache is not None and repeatable(obj):
            # NOTE: looked up before routing (which renders and tokenizes): the route is a function of the body.
            key = cache_key(raw.url.path, req.model or self.ctx.model_name, obj, owner())
            hit = self.cache.get(key)
            if hit is not None:
                charge_now(*hit.usage)  # a hit costs the key what the answer took
                return Response(hit.body, media_type=hit.media_type, headers={ROUTE_HEADER: "cache"})
        target = await self._upstream_model(req)
        charges: list[Charge] = []  # the quota holds of this request: what its answer cost, for the cache
        token = request_charges.set(charges)
        try:
            if target is not None:
                resp = await self._forward_charged(raw.url.path, {**obj, "model": target}, req)
            else:
                resp = await serve_local(self.ctx, req, raw)
                resp.headers[ROUTE_HEADER] = "local"
        finally:
            request_charges.reset(token)
        if key is not None and resp.status_code == 200:
            def cost(body: bytes) -> tuple[int, int]:
                used = usage_of(body)
                return used if used is not None else (sum(c.prompt for c in charges),
                                                      sum(c.completion for c in charges))
            if isinstance(resp, StreamingResponse):
                resp.body_iterator = self.cache.tee(key, resp.body_iterator, resp.media_type or "text/event-stream",
                                                    cost)
            else:
                self.cache.put(key, bytes(resp.body), resp.media_type or "application/json", cost(bytes(resp.body)))
        return resp

    async def _forward_charged(self, path: str, obj: dict[str, Any],
                               req: ChatCompletionRequest | CompletionRequest) -> Response:
        """Forward, holding the most the request may use against its key's quota; charged what the upstream
        reports it used (all it held when it reports nothing)."""
        charge = reserve(await self._most_tokens(req)) if has_quota() else None
        try:
            resp = await self._forward(path, obj, bool(req.stream))
        except BaseException:
            settle(charge, b"")
            raise
        if isinstance(resp, StreamingResponse):
            resp.body_iterator = settled(resp.body_iterator, charge) if charge is not None else resp.body_iterator
        else:
            settle(charge, bytes(resp.body))
        return resp

    async def _most_tokens(self, req: ChatCompletionRequest | CompletionRequest) -> int:
        """Prompts (counted here) + n x max_tokens each; no max_tokens: this server's context length, as a bound."""
        from hearth.entrypoints.openai.serving_completion import prompts_of

        if isinstance(req, CompletionRequest):
            prompts, max_tokens = [len(ids) for _, ids in prompts_of(self.ctx, req)], req.max_tokens
        else:
            prompts = [await self._prompt_tokens(req)]
            max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        each = max_tokens if max_tokens is not None else self.ctx.max_model_len
        return sum(prompts) + len(prompts) * (req.n or 1) * each

    async def _upstream_model(self, req: ChatCompletionRequest | CompletionRequest) -> str | None:
        """The model to ask the upstream for, or None to serve locally. Upstream-bound requests get the same
        sampling-parameter 400s as local ones; local ones are validated by the local path."""
        c, ctx = self.config, self.ctx
        if c.upstream is None:
            return None
        if req.model is not None and req.model != ctx.model_name:
            self._check_params(req)
            return req.model
        if c.upstream_min_prompt_tokens is None or await self._prompt_tokens(req) < c.upstream_min_prompt_tokens:
            return None
        self._check_params(req)
        return c.upstream_model or ctx.model_name

    async def _prompt_tokens(self, req: ChatCompletionRequest | CompletionRequest) -> int:
        """The longest prompt's token count, by this server's tokenizer and chat template."""
        from hearth.entrypoints.openai.serving_chat import render_chat
        from hearth.entrypoints.openai.serving_completion import prompts_of as prompt_token_ids

        if isinstance(req, CompletionRequest):
            return max(len(ids) for _, ids in prompt_token_ids(self.ctx, req))
        text = await render_chat(self.ctx, req.messages, req.add_generation_prompt, req.continue_final_message,
                           req.chat_template, req.chat_template_kwargs)
        return len(self.ctx.tokenizer.encode(text, add_special_tokens=req.add_special_tokens))

    @staticmethod
    def _check_params(req: ChatCompletionRequest | CompletionRequest) -> None:
        try:
            if isinstance(req, CompletionRequest):
                req.sampling_params(req.max_tokens, req.logprobs, req.prompt_logprobs)
            else:
                max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
                req.sampling_params(max_tokens, (req.top_logprobs or 0) if req.logprobs else None)
        except ValueError as e:
            raise bad_request(e, SAMPLING_PARAMS) from None

    async def _forward(self, path: str, obj: dict[str, Any], stream: bool) -> Response:
        assert self._client is not None  # NOTE: only called when an upstream is configured
        request = self._client.build_request("POST", path, json=obj)
        try:
            resp = await self._client.send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as e:
            self.upstream_requests.labels(status="503").inc()
            raise APIError(503, f"the upstream server {self.config.upstream} is unreachable ({type(e).__name__}: "
                                f"{e}); requests that need it fail until it is back", "server_error",
                           code="upstream_unavailable") from None
        except httpx.HTTPError as e:
            self.upstream_requests.labels(status="502").inc()
            raise self._broken(f"failed: {type(e).__name__}: {e}") from None
        media_type = resp.headers.get("content-type", "")
        headers = {ROUTE_HEADER: "upstream"}
        if stream and 200 <= resp.status_code < 300 and media_type.startswith("text/event-stream"):
            self.upstream_requests.labels(status=str(resp.status_code)).inc()
            return StreamingResponse(self._relay(resp), status_code=resp.status_code, media_type=media_type,
                                     headers=headers)
        try:
            data = await resp.aread()
        except httpx.HTTPError as e:
            self.upstream_requests.labels(status="502").inc()
            raise self._broken(f"broke off its answer: {type(e).__name__}: {e}") from None
        finally:
            await resp.aclose()
        if passes_through(resp.status_code, data):
            self.upstream_requests.labels(status=str(resp.status_code)).inc()
            return Response(data, status_code=resp.status_code, media_type="application/json", headers=headers)
        try:
            check_answer(resp.status_code, data, media_type, stream)
        except UpstreamAnswerError as e:
            self.upstream_requests.labels(status="502").inc()
            raise self._broken(str(e)) from None
        self.upstream_requests.labels(status=str(resp.status_code)).inc()
        return Response(data, status_code=resp.status_code, media_type="application/json", headers=headers)

    def _broken(self, what: str) -> APIError:
        return APIError(502, f"the upstream server {self.config.upstream} {what}", "server_error",
                        code="upstream_error", headers={ROUTE_HEADER: "upstream"})

    async def _relay(self, resp: httpx.Response) -> AsyncIterator[bytes]:
        """Upstream SSE events as they come, each checked (upstream_check.EventStream) before it is passed on; a cut
        connection, a broken event or a stream without [DONE] ends with an error event and [DONE] (so the answer
        cache does not keep it).
        NOTE: a client that goes away closes this generator, which closes the upstream connection (its abort)."""
        events = EventStream()
        try:
            async for chunk in resp.aiter_bytes():
                for event in events.feed(chunk):
                    yield event
                if events.done:
                    return
            events.finish()
        except httpx.HTTPError as e:
            yield self._error_event(f"broke off the stream: {type(e).__name__}: {e}")
        except UpstreamAnswerError as e:
            yield self._error_event(str(e))
        finally:
            await resp.aclose()

    def _error_event(self, what: str) -> bytes:
        # (not counted again in upstream_requests: the stream was counted by the status it started with)
        return (sse(error_body(f"the upstream server {self.config.upstream} {what}", "server_error", None,
                               "upstream_error")) + "data: [DONE]\n\n").encode()
