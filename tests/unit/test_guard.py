"""The ASGI guard: Host allow-list defaults, Origin checks with and without --allowed-origins (CORS)."""
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.testclient import TestClient

from hearth.entrypoints.openai.site_guard import SiteConfig, SiteGuard, _host_name, default_allowed_hosts


def test_default_allowed_hosts() -> None:
    assert default_allowed_hosts("127.0.0.1") == ["127.0.0.1", "localhost", "::1"]
    assert default_allowed_hosts("localhost") == ["localhost", "127.0.0.1", "::1"]
    assert default_allowed_hosts("10.0.0.5") == ["10.0.0.5"]
    assert default_allowed_hosts("0.0.0.0") is None and default_allowed_hosts("::") is None


def test_host_name_drops_the_port() -> None:
    assert _host_name("LocalHost:8000") == "localhost"
    assert _host_name("[::1]:8000") == "::1" and _host_name("::1") == "::1"


def app(origins: list[str]) -> TestClient:
    a = FastAPI()

    @a.post("/v1/x")
    async def x() -> dict:
        return {"ok": True}

    if origins:
        a.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["*"], allow_headers=["*"])
    a.add_middleware(SiteGuard, config=SiteConfig(allowed_hosts=["testserver"], allowed_origins=origins))
    return TestClient(a)


def test_cross_origin_refused_by_default_same_origin_passes() -> None:
    c = app([])
    assert c.post("/v1/x", headers={"origin": "https://evil.example"}).status_code == 403
    assert c.post("/v1/x", headers={"origin": "http://testserver"}).status_code == 200
    assert c.post("/v1/x").status_code == 200
    assert c.post("/v1/x", headers={"host": "rebound.example"}).status_code == 400


def test_allowed_origins_get_cors_and_preflight() -> None:
    c = app(["https://ui.example"])
    pre = c.options("/v1/x", headers={"origin": "https://ui.example", "access-control-request-method": "POST"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "https://ui.example"
    r = c.post("/v1/x", headers={"origin": "https://ui.example"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://ui.example"
    assert c.post("/v1/x", headers={"origin": "https://other.example"}).status_code == 403


def test_refusals_come_in_the_route_clients_shape() -> None:
    """401, 413 (declared and chunked) and 429 from the key guard: Anthropic's shape on /v1/messages, Ollama's on
    /api/, OpenAI's elsewhere, as the routes' own errors are."""
    from fastapi import Request

    from hearth.entrypoints.openai.api_keys import KeyRing, KeySpec
    from hearth.entrypoints.openai.body import parse_body
    from hearth.entrypoints.openai.errors import install_handlers
    from hearth.entrypoints.openai.guard import Guard
    from hearth.entrypoints.openai.protocol import TokenizeRequest

    a = FastAPI()
    install_handlers(a)
    for path in ("/v1/messages", "/api/chat", "/v1/chat/completions"):
        async def route(raw: Request) -> dict:
            await parse_body(raw, TokenizeRequest)
            return {"ok": True}
        a.add_api_route(path, route, methods=["POST"])
    paths = ("/v1/messages", "/api/chat", "/v1/chat/completions")
    ring = KeyRing([KeySpec(f"k{i}", f"k{i}", requests_per_minute=2) for i in range(len(paths))])
    a.add_middleware(Guard, keys=ring, max_body_bytes=64)
    c = TestClient(a)

    def chunked() -> object:
        yield b'{"prompt": "'
        yield b"x" * 100
        yield b'"}'

    answers = {}
    for i, path in enumerate(paths):  # one key per path: each one's limit counts its own requests
        key = {"authorization": f"Bearer k{i}"}
        answers[path] = [c.post(path, json={"prompt": "a"}),  # no key: 401
                         c.post(path, json={"prompt": "a" * 100}, headers=key),  # content-length over: 413
                         c.post(path, content=chunked(), headers=key),  # chunked, over: 413 while reading
                         c.post(path, json={"prompt": "a"}, headers=key),  # the second request this minute
                         c.post(path, json={"prompt": "a"}, headers=key)]  # third: 429
    for path, rs in answers.items():
        assert [r.status_code for r in rs] == [401, 413, 413, 200, 429], path
        for r in rs[:3] + rs[4:]:
            body = r.json()
            if path == "/v1/messages":
                assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
            elif path == "/api/chat":
                assert set(body) == {"error"} and isinstance(body["error"], str), body
            else:
                assert set(body["error"]) == {"message", "type", "param", "code"}, body
    kinds = [r.json()["error"]["type"] for r in answers["/v1/messages"] if r.status_code != 200]
    assert kinds == ["authentication_error", "request_too_large", "request_too_large", "rate_limit_error"]
    assert "requests_per_minute = 2" in answers["/api/chat"][4].json()["error"]
    assert answers["/api/chat"][4].headers["retry-after"]
