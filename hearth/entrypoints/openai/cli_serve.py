"""`hearth serve [MODEL]`: the OpenAI-compatible server on FastAPI + uvicorn, with vLLM's flag names.

Also runnable alone: `python -m hearth.entrypoints.openai.cli_serve [MODEL] --port 8000`.
"""
from __future__ import annotations

import argparse
import logging
import socket
import sys
import threading
import time

# The flags and their defaults are declared once, in serve_args.py (no torch there: `hearth serve --help`).
from hearth.entrypoints.openai.serve_args import (  # noqa: F401 (imported from here by callers)
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_REFILL_WAIT_MS,
    add_serve_args,
)

logger = logging.getLogger("hearth")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API",
                       description="Serve a model over an OpenAI-compatible HTTP API (vLLM's flag names).",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_serve_args(p)
    p.set_defaults(func=run_serve)


def _load_engine(ns: argparse.Namespace):
    """Build the LLMEngine behind a progress bar (elapsed time; the loader reports no finer progress)."""
    from tqdm import tqdm

    from hearth.engine.build import build_engine
    from hearth.entrypoints.cli import engine_args_from

    args = engine_args_from(ns)
    done = threading.Event()
    bar = tqdm(desc=f"loading {args.model or 'SmolLM2-135M-Instruct (default)'}", unit="s", file=sys.stderr,
               bar_format="{desc}: {elapsed}", mininterval=0.5,
               disable=not sys.stderr.isatty())

    def tick() -> None:
        while not done.wait(0.5):
            bar.update(0)
            bar.refresh()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        return build_engine(args)  # on a thread that then exits: hearth.engine.build says why
    finally:
        done.set()
        ticker.join()
        bar.close()


def run_serve(ns: argparse.Namespace) -> int:
    import uvicorn

    from hearth import envs
    from hearth.engine.async_engine import AsyncEngine
    from hearth.entrypoints.openai.gateway import Gateway, gateway_config_from
    from hearth.entrypoints.openai.reasoning import get_parser
    from hearth.entrypoints.openai.server import ServerConfig, build_app
    from hearth.entrypoints.openai.serving_common import ServingContext
    from hearth.entrypoints.openai.serving_keys import key_ring
    from hearth.metrics import ServerMetrics

    if ns.ray:
        from hearth.entrypoints.openai.cli_ray import run_ray_serve

        return run_ray_serve(ns)
    if ns.max_waiting_requests is not None and ns.max_waiting_requests < 0:
        raise ValueError(f"--max-waiting-requests must be >= 0, got {ns.max_waiting_requests}")
    if ns.refill_wait_ms < 0:
        raise ValueError(f"--refill-wait-ms must be >= 0, got {ns.refill_wait_ms}")
    if ns.reasoning_budget is not None and ns.reasoning_parser is None:  # (before the model loads)
        raise ValueError("--reasoning-budget needs --reasoning-parser (qwen3 or deepseek_r1)")
    if not 0 <= ns.port < 65536:
        raise ValueError(f"--port must be in [0, 65535], got {ns.port}")
    gateway_config = gateway_config_from(ns, envs.upstream_api_key())
    if ns.api_key_file:  # a broken key file fails now, not after the model has loaded
        key_ring(ns.api_key, ns.api_key_file, None)
    t0 = time.perf_counter()
    for flag, value in (("--header-timeout", ns.header_timeout), ("--body-timeout", ns.body_timeout)):
        if value <= 0:
            raise ValueError(f"{flag} must be > 0, got {value}")
    from hearth.entrypoints.openai.cli_models import build_router

    router = build_router(ns)
    if router is not None:  # several models and/or data parallel: engines in worker processes
        if gateway_config.enabled:
            raise ValueError("--upstream is for one model: drop it, or --models-dir / --data-parallel-size")
        sock = bind_socket(ns.host, ns.port)
        api_key = ns.api_key or (envs.api_key() if not ns.api_key_file else None)
        from hearth.entrypoints.openai.site_guard import default_allowed_hosts

        hosts = ns.allowed_hosts if ns.allowed_hosts is not None else default_allowed_hosts(ns.host)
        app = build_app(router, None, ServerConfig(api_key, ns.max_request_body_bytes, ns.drain_timeout,
                                                   ns.api_key_file, hosts, ns.allowed_origins, ns.body_timeout),
                        router=router)
        logger.info("serving %s on http://%s:%d/v1%s", ", ".join(repr(n) for n in router.names()), ns.host, ns.port,
                    " (API key required)" if api_key or ns.api_key_file else "")
        from hearth.entrypoints.openai.http_server import Server, header_timeout_protocol

        config = uvicorn.Config(app, host=ns.host, port=ns.port, log_level=ns.uvicorn_log_level,
                                http=header_timeout_protocol(ns.header_timeout),
                                timeout_graceful_shutdown=ns.drain_timeout)
        Server(config).run(sockets=[sock])
        return 0
    sock = bind_socket(ns.host, ns.port)  # before the (slow) load: a busy port fails in a second, not after it
    try:
        llm = _load_engine(ns)
    except BaseException:
        sock.close()
        raise
    mc = llm.model_config
    metrics = ServerMetrics(mc.served_model_name, max_model_len=mc.max_model_len)
    engine = AsyncEngine(llm, metrics, ns.max_waiting_requests, ns.refill_wait_ms / 1000)
    ctx = ServingContext(engine, llm.tokenizer, mc.served_model_name, mc.model, mc.max_model_len,
                         reasoning_parser=get_parser(ns.reasoning_parser), reasoning_budget=ns.reasoning_budget)
    ctx.check_reasoning()
    api_key = ns.api_key or (envs.api_key() if not ns.api_key_file else None)
    from hearth.entrypoints.openai.http_server import Server, header_timeout_protocol
    from hearth.entrypoints.openai.site_guard import default_allowed_hosts

    hosts = ns.allowed_hosts if ns.allowed_hosts is not None else default_allowed_hosts(ns.host)
    gateway = Gateway(gateway_config, ctx, metrics.registry) if gateway_config.enabled else None
    app = build_app(engine, ctx, ServerConfig(api_key, ns.max_request_body_bytes, ns.drain_timeout,
                                              ns.api_key_file, hosts, ns.allowed_origins, ns.body_timeout), gateway)
    logger.info("serving %r on http://%s:%d/v1 (ready in %.1f s%s)", mc.served_model_name, ns.host, ns.port,
                time.perf_counter() - t0, ", API key required" if api_key or ns.api_key_file else "")
    # uvicorn waits a little past the drain deadline, so the streams ended at it can send their last events.
    config = uvicorn.Config(app, host=ns.host, port=ns.port, log_level=ns.uvicorn_log_level,
                            http=header_timeout_protocol(ns.header_timeout),
                            timeout_graceful_shutdown=int(ns.drain_timeout) + 3)
    Server(config, on_exit=lambda: engine.drain(ns.drain_timeout)).run(sockets=[sock])
    return 0


def bind_socket(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound now (uvicorn listens on it once the engine is up)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port} ({e.strerror}): another process holds it; stop that "
                         "process or pass --port N") from None
    return sock


def main(argv: list[str] | None = None) -> int:
    from hearth.errors import LoadError

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s %(message)s", datefmt="%H:%M:%S")
    p = argparse.ArgumentParser(prog="hearth serve", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_serve_args(p)
    ns = p.parse_args(argv)
    try:
        return run_serve(ns)
    except (ValueError, LoadError, FileNotFoundError) as e:
        print(f"hearth serve: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
