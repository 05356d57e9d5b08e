"""Every route of the app x every kind of key that must not get through (issue 44, Reliability step 2).

The routes come from the app's own route table (build_app over stand-ins, in each serving mode), so a route added
tomorrow is a row here the day it is added: without an entry in ROUTES (how to call it, and what class of answer
each key must get) its row fails, naming it. Each cell is one request to a real `hearth serve` with
--api-key-file, and besides the status it asserts: never a 5xx, a refusal in the route's own API error shape, no
secret key and nothing of another key's (a stored response's marker, a cached answer) in the answer, and under
the model router, never a load of the model the key may not use.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from starlette.routing import Mount

from tests.server.conftest import TINY_ARGS, ServerProcess, start_server

ADMIN, OWNER, LIMITED = "sk-mx-admin", "sk-mx-owner", "sk-mx-limited"
EXHAUSTED, THIEF = "sk-mx-exhausted", "sk-mx-thief"
SECRETS = (ADMIN, OWNER, LIMITED, EXHAUSTED, THIEF)
MARKER = "owner-secret-7f3a"  # in the owner's stored response only: no other key's answer may carry it
KEY_KINDS = ("none", "limited", "exhausted", "thief")  # the columns; the owner and the admin only set things up
KEY_OF = {"none": None, "limited": LIMITED, "exhausted": EXHAUSTED, "thief": THIEF}


@dataclass(frozen=True)
class Mode:
    name: str
    allowed: str  # the model every key but `limited` names (and may use)
    forbidden: str  # the model `limited` names: outside its list
    limited_to: str  # the one model on `limited`'s list
    routed: bool = False  # a ModelRouter front (its app has the admin routes and answers for every model)
    cached: str | None = None  # an answer cache is on: the model the owner's cached answers are for
    scoped: bool = False  # the other keys' lists hold `allowed` only (never `forbidden`)


# `limited` may use only "elsewhere": not the one model
SINGLE = Mode("single", allowed="tiny", forbidden="tiny", limited_to="elsewhere", cached="tiny")
ROUTER = Mode("router", allowed="small", forbidden="other", limited_to="small", routed=True, scoped=True)
# `limited` may use the local model, not the upstream's; the owner's cached answers came from the upstream
GATEWAY = Mode("gateway", allowed="tiny", forbidden="big", limited_to="tiny", cached="big")
DATA_PARALLEL = Mode("data-parallel", allowed="tiny", forbidden="tiny", limited_to="elsewhere", routed=True)
MODES = (SINGLE, ROUTER, GATEWAY, DATA_PARALLEL)


def key_file(mode: Mode) -> str:
    scoped = f'models = ["{mode.allowed}"]\n' if mode.scoped else ""
    return (f'admin_key = "{ADMIN}"\n\n[[keys]]\nname = "owner"\nkey = "{OWNER}"\n{scoped}\n'
            f'[[keys]]\nname = "limited"\nkey = "{LIMITED}"\nmodels = ["{mode.limited_to}"]\n\n'
            f'[[keys]]\nname = "exhausted"\nkey = "{EXHAUSTED}"\ntokens_per_day = 1\n{scoped}\n'
            f'[[keys]]\nname = "thief"\nkey = "{THIEF}"\n{scoped}')


# ---- the route table -----------------------------------------------------------------------------------------

def app_routes(mode: Mode) -> list[tuple[str, str]]:
    """(method, path) of every route build_app registers in this mode; a mount as GET <mount>/{path}."""
    from hearth.engine_args import EngineArgs
    from hearth.entrypoints.openai.model_router import ModelRouter, RouterConfig
    from hearth.entrypoints.openai.server import ServerConfig, build_app

    if not mode.routed:  # (build_app only wires routes: engine, context, gateway are not touched till a request)
        gateway = SimpleNamespace() if mode is GATEWAY else None
        app = build_app(SimpleNamespace(metrics=None), SimpleNamespace(), ServerConfig(), gateway=gateway)
    else:
        app = build_app(None, None, ServerConfig(), router=ModelRouter([], EngineArgs(model="x"), RouterConfig()))
    out = []
    for route in app.routes:
        if isinstance(route, Mount):
            out.append(("GET", route.path + "/{path}"))
        else:
            out.extend((m, route.path) for m in sorted(route.methods - {"HEAD"}))  # HEAD: GET's, answered alike
    return out


@dataclass
class Call:
    """What a cell sends: `model` is the model the key names, `stolen` the owner's stored response id."""
    kind: str
    model: str
    stolen: str


# Answer classes: what each key kind gets on the route (a valid key's own answer is `ok`).
PUBLIC = "public"  # open to anyone: 200 whatever the key
LISTING = "listing"  # any valid key; lists only the models the key may see
KEYED = "keyed"  # any valid key, no model
MODEL = "model"  # names a model: limited 403, exhausted 429 when it runs the engine
STORED = "stored"  # the owner's stored response: every other key gets the 404 of an unknown id
ADMIN_ONLY = "admin"  # the admin key only: 403 for every other key
REFUSED = "refused"  # Ollama's model-management routes: a fixed 400 for any valid key


@dataclass(frozen=True)
class RouteSpec:
    cls: str
    body: Callable[[Call], dict[str, Any]] | None = None
    engine: bool = False  # runs the model (so holds tokens: the exhausted key's 429)
    ok: int = 200  # the route's answer to a key it lets through
    path: Callable[[Call], str] | None = None  # a path with parameters, filled in


def _chat(c: Call) -> dict[str, Any]:
    return {"model": c.model, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 2,
            "temperature": 0}


def _stored(c: Call) -> str:
    return f"/v1/responses/{c.stolen}"


ROUTES: dict[tuple[str, str], RouteSpec] = {
    ("GET", "/health"): RouteSpec(PUBLIC),
    ("GET", "/version"): RouteSpec(PUBLIC),
    ("GET", "/metrics"): RouteSpec(PUBLIC),
    ("GET", "/"): RouteSpec(PUBLIC),  # the page asks for the key itself
    ("GET", "/static/{path}"): RouteSpec(PUBLIC, path=lambda c: "/static/app.js"),
    ("GET", "/openapi.json"): RouteSpec(PUBLIC),
    ("GET", "/docs"): RouteSpec(PUBLIC),
    ("GET", "/docs/oauth2-redirect"): RouteSpec(PUBLIC),
    ("GET", "/redoc"): RouteSpec(PUBLIC),
    ("GET", "/v1/models"): RouteSpec(LISTING),
    ("GET", "/status"): RouteSpec(LISTING),
    ("GET", "/api/tags"): RouteSpec(LISTING),
    ("GET", "/api/ps"): RouteSpec(LISTING),
    ("GET", "/api/version"): RouteSpec(KEYED),
    ("GET", "/keys/usage"): RouteSpec(ADMIN_ONLY),
    ("GET", "/models"): RouteSpec(ADMIN_ONLY),
    ("POST", "/models/load"): RouteSpec(ADMIN_ONLY, lambda c: {"model": c.model}),
    ("POST", "/models/unload"): RouteSpec(ADMIN_ONLY, lambda c: {"model": c.model}),
    ("POST", "/v1/completions"): RouteSpec(MODEL, lambda c: {"model": c.model, "prompt": "Hello there",
                                                             "max_tokens": 2, "temperature": 0}, engine=True),
    ("POST", "/v1/chat/completions"): RouteSpec(MODEL, _chat, engine=True),
    ("POST", "/v1/embeddings"): RouteSpec(MODEL, lambda c: {"model": c.model, "input": "Hello"}, engine=True),
    # (the tiny model is a LlamaForCausalLM: no classification head to score with, a 400 of its own)
    ("POST", "/v1/score"): RouteSpec(MODEL, lambda c: {"model": c.model, "text_1": "a", "text_2": "b"},
                                     engine=True, ok=400),
    ("POST", "/v1/rerank"): RouteSpec(MODEL, lambda c: {"model": c.model, "query": "a", "documents": ["b"]},
                                      engine=True, ok=400),
    ("POST", "/tokenize"): RouteSpec(MODEL, lambda c: {"model": c.model, "prompt": "Hello"}),
    ("POST", "/detokenize"): RouteSpec(MODEL, lambda c: {"model": c.model, "tokens": [5, 6]}),
    # the thief goes on from the owner's stored response: the 404 of an unknown id
    ("POST", "/v1/responses"): RouteSpec(MODEL, lambda c: {
        "model": c.model, "input": "Hello", "max_output_tokens": 2, "temperature": 0,
        **({"previous_response_id": c.stolen} if c.kind == "thief" else {})}, engine=True),
    ("GET", "/v1/responses/{response_id}"): RouteSpec(STORED, path=_stored),
    ("DELETE", "/v1/responses/{response_id}"): RouteSpec(STORED, path=_stored),
    ("POST", "/v1/messages"): RouteSpec(MODEL, lambda c: {"model": c.model, "max_tokens": 2, "messages": [
        {"role": "user", "content": "Hello"}]}, engine=True),
    ("POST", "/v1/messages/count_tokens"): RouteSpec(MODEL, lambda c: {"model": c.model, "messages": [
        {"role": "user", "content": "Hello"}]}),
    ("POST", "/api/show"): RouteSpec(MODEL, lambda c: {"model": c.model}),
    ("POST", "/api/chat"): RouteSpec(MODEL, lambda c: {"model": c.model, "stream": False, "options": {
        "num_predict": 2}, "messages": [{"role": "user", "content": "Hello"}]}, engine=True),
    ("POST", "/api/generate"): RouteSpec(MODEL, lambda c: {"model": c.model, "prompt": "Hello", "stream": False,
                                                           "options": {"num_predict": 2}}, engine=True),
    ("POST", "/api/embed"): RouteSpec(MODEL, lambda c: {"model": c.model, "input": "Hello"}, engine=True),
    ("POST", "/api/embeddings"): RouteSpec(MODEL, lambda c: {"model": c.model, "prompt": "Hello"}, engine=True),
    **{(m, p): RouteSpec(REFUSED, lambda c: {"model": c.model})
       for p in ("/api/pull", "/api/push", "/api/create", "/api/copy", "/api/delete") for m in ("POST", "DELETE")},
}

# Cells the matrix found wrong and that are not fixed here: (mode, method, path, kind) -> why.
XFAIL: dict[tuple[str, str, str, str], str] = {}
def cells(mode: Mode) -> list[Any]:
    out = []
    for method, path in app_routes(mode):
        for kind in KEY_KINDS:
            cell = (mode.name, method, path, kind)
            reason = XFAIL.get(cell)
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            out.append(pytest.param(method, path, kind, marks=marks, id=f"{method} {path} {kind}"))
    return out


# ---- servers ---------------------------------------------------------------------------------------------------

@dataclass
class Served:
    srv: ServerProcess
    mode: Mode
    stolen: str = ""  # the owner's stored response id
    primed: dict[str, dict[str, Any]] = field(default_factory=dict)  # path -> the owner's cached request


def _h(key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"} if key else {}


def _own_things(served: Served) -> None:
    """What the owner leaves on the server for other keys to (fail to) reach: a stored response, cached answers."""
    with httpx.Client(base_url=served.srv.url, timeout=120, headers=_h(OWNER)) as c:
        r = c.post("/v1/responses", json={"model": served.mode.allowed, "input": "Hello", "store": True,
                                          "instructions": MARKER, "metadata": {"secret": MARKER},
                                          "max_output_tokens": 2})
        assert r.status_code == 200, r.text
        served.stolen = r.json()["id"]
        if served.mode.cached is not None:  # (--answer-cache-size)
            for path in ("/v1/completions", "/v1/chat/completions"):
                body = ROUTES[("POST", path)].body(Call("owner", served.mode.cached, ""))
                for _ in range(2):
                    r = c.post(path, json=body)
                assert r.status_code == 200 and r.headers.get("x-hearth-route") == "cache", r.text
                served.primed[path] = body


@pytest.fixture(scope="module")
def single(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    d = tmp_path_factory.mktemp("matrix-single")
    (d / "keys.toml").write_text(key_file(SINGLE))
    srv = start_server([tiny_model, *TINY_ARGS, "--served-model-name", SINGLE.allowed, "--api-key-file",
                        str(d / "keys.toml"), "--answer-cache-size", "16"], str(d / "server.log"))
    served = Served(srv, SINGLE)
    try:
        _own_things(served)
        yield served
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def router(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    d = tmp_path_factory.mktemp("matrix-router")
    (d / "keys.toml").write_text(key_file(ROUTER))
    (d / "models").mkdir()
    for name in (ROUTER.allowed, ROUTER.forbidden):  # two models (one checkpoint): what matters is which loads
        os.symlink(tiny_model, d / "models" / name)
    srv = start_server(["--models-dir", str(d / "models"), "--max-loaded-models", "1", "--api-key-file",
                        str(d / "keys.toml"), "--kv-cache-space", "0.05", "--threads", "1"], str(d / "server.log"))
    served = Served(srv, ROUTER)
    try:
        _own_things(served)
        yield served
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def gateway(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`--upstream` to a second server (no keys of its own) serving the checkpoint as `forbidden`."""
    d = tmp_path_factory.mktemp("matrix-gateway")
    (d / "keys.toml").write_text(key_file(GATEWAY))
    upstream = start_server([tiny_model, *TINY_ARGS, "--served-model-name", GATEWAY.forbidden],
                            str(d / "upstream.log"))
    try:
        srv = start_server([tiny_model, *TINY_ARGS, "--served-model-name", GATEWAY.allowed, "--api-key-file",
                            str(d / "keys.toml"), "--upstream", upstream.url + "/v1", "--answer-cache-size", "16"],
                           str(d / "server.log"))
        served = Served(srv, GATEWAY)
        try:
            _own_things(served)
            yield served
        finally:
            srv.stop()
    finally:
        upstream.stop()


@pytest.fixture(scope="module")
def data_parallel(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    d = tmp_path_factory.mktemp("matrix-dp")
    (d / "keys.toml").write_text(key_file(DATA_PARALLEL))
    srv = start_server([tiny_model, *TINY_ARGS, "--served-model-name", DATA_PARALLEL.allowed, "--api-key-file",
                        str(d / "keys.toml"), "--data-parallel-size", "2"], str(d / "server.log"))
    served = Served(srv, DATA_PARALLEL)
    try:
        _own_things(served)
        yield served
    finally:
        srv.stop()


def loaded(served: Served) -> dict[str, str]:
    rows = served.srv.http.get("/models", headers=_h(ADMIN)).json()["data"]
    return {m["name"]: m["state"] for m in rows}


# ---- one cell ---------------------------------------------------------------------------------------------------

def _refusal(path: str, r: httpx.Response, status: int, code: str | None) -> None:
    """A refusal with this status, in the error shape the route's own clients read."""
    assert r.status_code == status, f"expected {status}, got {r.status_code}: {r.text[:300]}"
    body = r.json()
    if path.startswith("/api/"):  # Ollama's
        assert isinstance(body.get("error"), str) and set(body) == {"error"}, body
    elif path.startswith("/v1/messages"):  # Anthropic's
        types = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                 429: "rate_limit_error"}
        assert body["type"] == "error" and body["error"]["type"] == types[status], body
    else:  # OpenAI's
        assert isinstance(body["error"]["message"], str), body
        if code is not None:
            assert body["error"]["code"] == code, body


def expected(spec: RouteSpec, kind: str) -> tuple[int, str | None]:
    """(status, OpenAI error code) the key kind must get on a route of this class; code None: the route's own
    answer, not a refusal of the key."""
    if spec.cls == PUBLIC:
        return 200, None
    if kind == "none":
        return 401, "invalid_api_key"
    if spec.cls == ADMIN_ONLY:
        return 403, "admin_key_required"
    if spec.cls == STORED:
        return 404, "response_not_found"
    if spec.cls == REFUSED:
        return 400, None  # (Ollama's own answer, not a refusal of the key)
    if spec.cls == MODEL:
        if kind == "limited":
            return 403, "model_not_allowed"
        if kind == "exhausted" and spec.engine:
            return 429, "rate_limit_exceeded"
        if kind == "thief" and spec.body is not None and "previous_response_id" in spec.body(
                Call(kind, "m", "id")):
            return 404, "response_not_found"
        return spec.ok, None
    return 200, None  # LISTING, KEYED


def run_cell(served: Served, method: str, path: str, kind: str) -> None:
    spec = ROUTES.get((method, path))
    if spec is None:
        pytest.fail(f"no request template for {method} {path}: add it to ROUTES in {__name__} (with its answer "
                    f"class; a public route as PUBLIC) so every key is tried on it")
    mode = served.mode
    call = Call(kind, mode.forbidden if kind == "limited" else mode.allowed, served.stolen)
    url = spec.path(call) if spec.path is not None else path
    if kind == "thief" and path in served.primed:
        body: dict[str, Any] | None = served.primed[path]  # exactly what the owner's cached answer was for
    else:
        body = spec.body(call) if spec.body is not None else None
    r = served.srv.http.request(method, url, json=body, headers=_h(KEY_OF[kind]), timeout=120)

    assert r.status_code < 500, f"{method} {url} as {kind}: {r.status_code} {r.text[:300]}"
    status, code = expected(spec, kind)
    if code is None:  # the route's own answer to a key it lets through
        assert r.status_code == status, f"{method} {url} as {kind}: {r.status_code} {r.text[:300]}"
    else:
        _refusal(path, r, status, code)
    assert not any(s in r.text for s in SECRETS), "a key in the answer"
    assert MARKER not in r.text, "the owner's stored response in another key's answer"
    assert r.headers.get("x-hearth-route") != "cache", "answered from another key's cached answer"
    if spec.cls == LISTING and kind == "limited":  # it sees only its own models
        assert f'"{mode.forbidden}' not in r.text, r.text[:300]
    if mode is ROUTER and kind == "limited":
        assert loaded(served).get(mode.forbidden) == "unloaded", "a refused key loaded a model"


def test_a_route_without_a_template_fails_naming_it() -> None:
    with pytest.raises(pytest.fail.Exception, match="no request template for POST /v1/brand-new"):
        run_cell(Served(None, SINGLE), "POST", "/v1/brand-new", "none")  # type: ignore[arg-type]


def test_the_table_names_only_routes_the_app_has() -> None:
    routes = set().union(*(app_routes(mode) for mode in MODES))
    assert not set(ROUTES) - routes, f"ROUTES entries for routes the app does not have: {set(ROUTES) - routes}"


@pytest.mark.parametrize("method, path, kind", cells(SINGLE))
def test_single_model(single: Served, method: str, path: str, kind: str) -> None:
    run_cell(single, method, path, kind)


@pytest.mark.parametrize("method, path, kind", cells(ROUTER))
def test_router(router: Served, method: str, path: str, kind: str) -> None:
    run_cell(router, method, path, kind)


@pytest.mark.parametrize("method, path, kind", cells(GATEWAY))
def test_gateway(gateway: Served, method: str, path: str, kind: str) -> None:
    run_cell(gateway, method, path, kind)


@pytest.mark.parametrize("method, path, kind", cells(DATA_PARALLEL))
def test_data_parallel(data_parallel: Served, method: str, path: str, kind: str) -> None:
    run_cell(data_parallel, method, path, kind)


def test_owners_things_survive_the_matrix(single: Served, router: Served, gateway: Served,
                                          data_parallel: Served) -> None:
    for served in (single, router, gateway, data_parallel):  # DELETE by every other key removed nothing
        r = served.srv.http.get(f"/v1/responses/{served.stolen}", headers=_h(OWNER))
        assert r.status_code == 200 and r.json()["metadata"] == {"secret": MARKER}, r.text
    # under the router, nothing any key but the admin sent loaded the model outside its list
    assert loaded(router)[ROUTER.forbidden] == "unloaded"
