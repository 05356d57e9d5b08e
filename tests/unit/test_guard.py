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
