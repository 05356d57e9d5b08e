"""`hearth serve MODEL --ray`: the same server as Ray Serve replicas (hearth/ray/). The flags are declared in
serve_args.ServerArgs; Ray is imported only when --ray is given, so `hearth serve --help` works without it."""
from __future__ import annotations

import logging
import signal
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hearth.entrypoints.openai.serve_plan import RayPlan

logger = logging.getLogger("hearth")

DEFAULT_TARGET_ONGOING_REQUESTS = 8.0


def run_ray_serve(plan: RayPlan) -> int:
    """Deploy the planned application (serve_plan.plan_serve checked every flag) and serve until a signal."""
    try:
        import ray
        from ray import serve
    except ImportError:
        raise ValueError("--ray needs Ray Serve: pip install 'hearth[ray]'") from None
    from hearth.ray.app import deploy_plan

    app = deploy_plan(plan.app)
    t0 = time.perf_counter()
    ray.init(address=plan.address, include_dashboard=False if plan.address is None else None)
    serve.start(http_options={"host": plan.host, "port": plan.port})
    try:
        serve.run(app, name="hearth", route_prefix="/")
    except RuntimeError as e:
        why = _deploy_failure(serve)
        ray.shutdown()
        raise ValueError(f"{e} ({why})" if why else str(e)) from None
    logger.info("serving on http://%s:%d/v1 through Ray Serve (ready in %.1f s)", plan.host, plan.port,
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
