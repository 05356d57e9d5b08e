"""One /metrics for all replicas: each replica pushes its exposition to a board actor every second; the ingress
merges the live ones family by family, each replica's `engine` label set to its name (the label vLLM uses to tell
engines apart). A plain Ray actor, not a Serve method, so the pushes stay out of Serve's access log."""
from __future__ import annotations

import time
from collections.abc import Iterator

import ray

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families


class _Merged:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def merge_expositions(by_replica: dict[str, str]) -> bytes:
    families: dict[str, Metric] = {}
    for replica, text in sorted(by_replica.items()):
        for fam in text_string_to_metric_families(text):
            merged = families.get(fam.name)
            if merged is None:
                merged = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            merged.samples.extend(s._replace(labels={**s.labels, "engine": replica}) for s in fam.samples)
    registry = CollectorRegistry()
    registry.register(_Merged(list(families.values())))
    return generate_latest(registry)


BOARD_NAMESPACE = "hearth"
STALE_S = 15.0  # a replica silent this long is gone (killed, scaled down): its series leave /metrics


def board_name(app_name: str) -> str:
    return f"hearth-metrics::{app_name}"


@ray.remote(num_cpus=0)
class MetricsBoard:
    """Owned by the ingress replica that created it (it goes when that replica goes; the next one makes another)."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[float, str]] = {}

    def report(self, replica: str, text: str) -> None:
        self._entries[replica] = (time.monotonic(), text)

    def live(self) -> dict[str, str]:
        now = time.monotonic()
        self._entries = {r: e for r, e in self._entries.items() if now - e[0] < STALE_S}
        return {r: text for r, (_, text) in self._entries.items()}
