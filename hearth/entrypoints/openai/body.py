"""Reading a JSON request body: content type, depth limit, text sanitizing, then the pydantic model.

Every failure is a 4xx naming the fix; nothing here raises past the error handlers.
"""
from __future__ import annotations

import asyncio
import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from hearth.entrypoints.openai.errors import APIError

MAX_JSON_DEPTH = 64
OFF_LOOP_BYTES = 1 << 20  # bodies larger than this are parsed in _PARSER's threads
PARSE_THREADS = 2
# The content types a browser may send cross-site without a CORS preflight: a JSON route that parsed them would
# serve a form on any web page the user visits.
_REFUSED_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data")
_SURROGATE = re.compile("[\ud800-\udfff]")
_PARSER = ThreadPoolExecutor(PARSE_THREADS, thread_name_prefix="hearth-json")

M = TypeVar("M", bound=BaseModel)


def check_content_type(raw: Request) -> None:
    ctype = raw.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if ctype in _REFUSED_TYPES:
        raise APIError(415, f"this route takes a JSON body, not {ctype}: send 'Content-Type: application/json'",
                       param="content-type", code="unsupported_media_type")


def sanitize(obj: Any, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Replace lone UTF-16 surrogates (JSON's "\\ud800" escapes; no tokenizer or encoder takes them) with U+FFFD,
    and refuse nesting deeper than max_depth. Iterative, so a deep body cannot exhaust the stack here."""
    def clean(s: str) -> str:
        return _SURROGATE.sub("\ufffd", s) if _SURROGATE.search(s) else s

    if isinstance(obj, str):
        return clean(obj)
    stack: list[tuple[Any, int, str | None]] = [(obj, 1, None)]
    while stack:
        node, depth, key = stack.pop()
        if depth > max_depth:
            raise APIError(400, f"the request body is nested more than {max_depth} levels deep", param=key)
        if isinstance(node, dict):
            items = list(node.items())
            if any(isinstance(k, str) and _SURROGATE.search(k) for k, _ in items):
                node.clear()
                node.update((clean(k), v) for k, v in items)
            for k, v in node.items():
                if isinstance(v, str):
                    node[k] = clean(v)
                elif isinstance(v, (dict, list)):
                    stack.append((v, depth + 1, key if key is not None else k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                if isinstance(v, str):
                    node[i] = clean(v)
                elif isinstance(v, (dict, list)):
                    stack.append((v, depth + 1, key))
    return obj


class JSONTextError(ValueError):
    """JSON text from a request that cannot be read: not JSON, or nested deeper than the limit. `param`: the
    top-level field under which it nests too deep, when known."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def parse_json(data: bytes | str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The one reader of JSON text a client sent (bodies, and JSON strings inside them such as tool-call arguments):
    the depth limit applies before anything else sees the value, and a nesting deep enough to exhaust the
    parser's stack is the same error (never a RecursionError). Sanitizes lone surrogates (see sanitize)."""
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise JSONTextError(f"not valid JSON: {e}") from None
    except RecursionError:
        raw = data.encode() if isinstance(data, str) else data
        raise JSONTextError(f"nested more than {max_depth} levels deep", _deep_key(raw, max_depth)) from None
    try:
        return sanitize(obj, max_depth)
    except APIError as e:
        raise JSONTextError(e.message.removeprefix("the request body is "), e.param) from None


def loads(data: bytes) -> Any:
    """A request body as JSON; every failure is a 400 naming the top-level field when there is one."""
    try:
        return parse_json(data)
    except JSONTextError as e:
        raise APIError(400, f"the request body is {e}", param=e.param) from None


async def aloads(data: bytes) -> Any:
    """loads, off the event loop for a body over OFF_LOOP_BYTES (its parse and depth check take long enough to hold
    up every other request, /health included); at most PARSE_THREADS such parses at once, so a burst of large
    bodies holds at most that many parsed copies."""
    if len(data) <= OFF_LOOP_BYTES:
        return loads(data)
    return await asyncio.get_running_loop().run_in_executor(_PARSER, loads, data)


def _deep_key(data: bytes, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """The top-level key under which the JSON text nests deeper than max_depth (for the error's param)."""
    depth, in_string, escaped, start, last, key = 0, False, False, 0, "", None
    text = data.decode("utf-8", "replace")
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
                last = text[start:i] if depth == 1 else last
        elif ch == '"':
            in_string, start = True, i + 1
        elif ch == ":" and depth == 1:
            key = last
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                return key
        elif ch in "]}":
            depth -= 1
    return None


async def parse_body(raw: Request, model: type[M]) -> M:
    """A JSON body as `model`: bad JSON, bad fields, too deep or a form content type are 4xx errors.
    A missing content type is taken as JSON (curl users forget it)."""
    check_content_type(raw)
    obj = await aloads(await raw.body())
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        raise RequestValidationError(e.errors()) from None


_SCHEMAS: dict[str, dict] = {}  # the models behind openapi_body, for the spec's components


def openapi_body(model: type[BaseModel]) -> dict:
    """openapi_extra for a route that parses `model` by hand (parse_body): its request body in the spec."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    _SCHEMAS.update(schema.pop("$defs", {}))
    _SCHEMAS[model.__name__] = schema
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


def install_openapi(app: Any) -> None:
    """Add openapi_body's schemas to the app's OpenAPI components."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            spec = build()
            spec.setdefault("components", {}).setdefault("schemas", {}).update(_SCHEMAS)
        return app.openapi_schema

    app.openapi = openapi
