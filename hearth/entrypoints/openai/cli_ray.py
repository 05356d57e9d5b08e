"""`hearth serve MODEL --ray`: the same server as Ray Serve replicas (hearth/ray/). The flags are declared in
serve_args.ServerArgs; Ray is imported only when --ray is given, so `hearth serve --help` works without it."""
from __future__ import annotations

import argparse
import logging
import signal
import threading
import time

logger = logging.getLogger("hearth")

DEFAULT_TARGET_ONGOING_REQUESTS = 8.0


def run_ray_serve(ns: argparse.Namespace) -> int:
    try:
        import ray
        from ray import serve
    except ImportError:
        raise ValueError("--ray needs Ray Serve: pip install 'hearth[ray]'") from None
    from hearth import envs
    from hearth.entrypoints.cli import ENGINE_ARG_NAMES
    from hearth.ray import build_app

    if not 0 <= ns.port < 65536:
        raise ValueError(f"--port must be in [0, 65535], got {ns.port}")
    engine_args = {k: getattr(ns, k) for k in ENGINE_ARG_NAMES if hasattr(ns, k) and k != "model"}
    from hearth.entrypoints.openai.gateway import gateway_config_from

    app = build_app(ns.model, num_replicas=ns.num_replicas, min_replicas=ns.min_replicas, max_replicas=ns.max_replicas,
                    target_ongoing_requests=ns.target_ongoing_requests,
                    num_cpus_per_replica=ns.num_cpus_per_replica,
                    api_key=ns.api_key or (envs.api_key() if not ns.api_key_file else None),
                    api_key_file=ns.api_key_file, gateway=gateway_config_from(ns, envs.upstream_api_key()),
                    max_waiting_requests=ns.max_waiting_requests, refill_wait_ms=ns.refill_wait_ms,
                    max_request_body_bytes=ns.max_request_body_bytes, drain_timeout=ns.drain_timeout,
                    **engine_args)
    t0 = time.perf_counter()
    ray.init(address=ns.ray_address, include_dashboard=False if ns.ray_address is None else None)
    serve.start(http_options={"host": ns.host, "port": ns.port})
    try:
        serve.run(app, name="hearth", route_prefix="/")
    except RuntimeError as e:
        why = _deploy_failure(serve)
        ray.shutdown()
        raise ValueError(f"{e} ({why})" if why else str(e)) from None
    logger.info("serving on http://%s:%d/v1 through Ray Serve (ready in %.1f s)", ns.host, ns.port,
                time.perf_counter() - t0)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        stop.wait()
    finally:
        serve.delete("hearth")  # this app only: a shared cluster's other Serve apps keep running
        ray.shutdown()
    return 0


def _deploy_failure(serve) -> str:
    """The last line of the failed replicas' error (Serve keeps the whole traceback in the deployment status)."""
    try:
        app = serve.status().applications["hearth"]
        messages = [d.message for d in app.deployments.values() if d.message]
    except Exception:  # noqa: BLE001 (nothing better to say than serve.run's own error)
        return ""
    lines = [line.strip() for m in messages for line in m.splitlines() if line.strip()]
    return lines[-1] if lines else ""
