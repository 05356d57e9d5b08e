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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from fastapi import FastAPI

    from hearth.config import EngineArgs
    from hearth.entrypoints.openai.serve_plan import FrontPlan, InProcessPlan, RouterPlan

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


def _load_engine(args: EngineArgs):
    """Build the LLMEngine behind a progress bar (elapsed time; the loader reports no finer progress)."""
    from tqdm import tqdm

    from hearth.engine.build import build_engine

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
    from hearth.entrypoints.openai.serve_plan import InProcessPlan, RouterPlan, plan_serve

    plan = plan_serve(ns)  # every flag checked (or refused) before a model loads or a socket opens
    if isinstance(plan, RouterPlan):
        return _serve_router(plan)
    if isinstance(plan, InProcessPlan):
        return _serve_in_process(plan)
    from hearth.entrypoints.openai.cli_ray import run_ray_serve

    return run_ray_serve(plan)


def _serve_router(plan: RouterPlan) -> int:
    """Several models and/or data parallel: engines in worker processes behind a ModelRouter."""
    from hearth.entrypoints.openai.server import build_app

    router = plan.build()
    front = plan.front
    sock = bind_socket(front.host, front.port)
    app = build_app(None, None, front.server, router=router)
    logger.info("serving %s on http://%s:%d/v1%s", ", ".join(repr(n) for n in router.names()), front.host,
                front.port, " (API key required)" if front.server.api_key or front.server.api_key_file else "")
    _run_uvicorn(app, sock, front, graceful=front.server.drain_timeout)
    return 0


def _serve_in_process(plan: InProcessPlan) -> int:
    """One model: its engine in this process (no process hop on the token path)."""
    from hearth.entrypoints.openai.server import build_app
    from hearth.entrypoints.openai.serving_build import build_serving

    t0 = time.perf_counter()
    front = plan.front
    sock = bind_socket(front.host, front.port)  # before the (slow) load: a busy port fails in a second, not after it
    try:
        llm = _load_engine(plan.engine)
    except BaseException:
        sock.close()
        raise
    try:
        serving = build_serving(llm, plan.serve, plan.lora_modules)
    except BaseException:
        sock.close()
        raise
    app = build_app(serving.client, serving.ctx, front.server, serving.gateway, adapters=serving.adapters)
    logger.info("serving %r on http://%s:%d/v1 (ready in %.1f s%s)", serving.ctx.model_name, front.host, front.port,
                time.perf_counter() - t0,
                ", API key required" if front.server.api_key or front.server.api_key_file else "")
    # uvicorn waits a little past the drain deadline, so the streams ended at it can send their last events.
    drain = front.server.drain_timeout
    _run_uvicorn(app, sock, front, graceful=int(drain) + 3, on_exit=lambda: serving.client.drain(drain))
    return 0


def _run_uvicorn(app: FastAPI, sock: socket.socket, front: FrontPlan, graceful: float,
                 on_exit: Callable[[], None] | None = None) -> None:
    import uvicorn

    from hearth.entrypoints.openai.http_server import Server, header_timeout_protocol

    config = uvicorn.Config(app, host=front.host, port=front.port, log_level=front.log_level,
                            http=header_timeout_protocol(front.header_timeout), timeout_graceful_shutdown=graceful)
    Server(config, on_exit=on_exit).run(sockets=[sock])


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
