"""OpenAI-style errors: {"error": {"message", "type", "param", "code"}}, and the handlers that make every user
mistake a 4xx (never a 500)."""
from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from hearth.errors import ParamError

logger = logging.getLogger("hearth")


class APIError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | int | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# Anthropic's error types by HTTP status
ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                         404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                         503: "overloaded_error"}


def anthropic_body(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": ANTHROPIC_ERROR_TYPES.get(status, "api_error"), "message": message}}


def shaped_for(path: str, status: int, body: dict) -> dict:
    """An OpenAI-style error body in the shape the route's own clients read: Anthropic's on /v1/messages, Ollama's
    ({"error": "..."}) on /api/; as it is elsewhere."""
    message = body["error"]["message"]
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return anthropic_body(status, message)
    if path.startswith("/api/"):
        return {"error": message}
    return body


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(error_body(err.message, err.type, err.param, err.code), status_code=err.status,
                        headers=err.headers)


def bad_request(e: ValueError, known_params: set[str] | None = None) -> APIError:
    """A ValueError from SamplingParams or the engine as a 400; a ParamError names its parameter (kept when it is
    one of known_params, the fields this API has)."""
    param = e.param if isinstance(e, ParamError) else None
    if known_params is not None and param not in known_params:
        param = None
    return APIError(400, str(e), param=param)


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request body", None
    first = errors[0]
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {first.get('msg')}", None
    param = loc[0] if loc else None  # OpenAI names the top-level field; the message has the full path
    where = f"{'.'.join(loc)}: " if loc else ""
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return f"{where}{first.get('msg')}{more}", param


# Codes for errors raised below the routes (the guard's body checks while a route reads a chunked body).
_HTTP_CODES = {408: "request_timeout", 413: "request_too_large"}


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        body = shaped_for(request.url.path, exc.status, error_body(exc.message, exc.type, exc.param, exc.code))
        return JSONResponse(body, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(exc)
        return JSONResponse(shaped_for(request.url.path, 400, error_body(message, param=param)), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # (also the guard's 413 and the site guard's 408, raised while a route reads a chunked or stalled body)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        code = _HTTP_CODES.get(exc.status_code)
        body = shaped_for(request.url.path, exc.status_code, error_body(str(exc.detail), kind, None, code))
        return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    from hearth.engine.async_engine import EngineDeadError

    @app.exception_handler(EngineDeadError)
    async def _engine_dead(_: Request, exc: EngineDeadError) -> JSONResponse:
        # An engine that failed mid-request (a non-streaming one): a worker process that died is a 503.
        status = getattr(exc, "status_code", 500)
        return JSONResponse(error_body(str(exc), "server_error", None, "engine_dead"), status_code=status)

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("internal error")
        return JSONResponse(error_body(f"internal server error: {type(exc).__name__}", "server_error"),
                            status_code=500)
