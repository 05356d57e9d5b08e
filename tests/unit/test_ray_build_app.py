"""hearth.ray.build_app and `hearth serve --ray` refuse bad settings before any Ray cluster is involved."""
from __future__ import annotations

import pytest

pytest.importorskip("ray.serve")


@pytest.mark.parametrize("kwargs, message", [
    ({"num_replicas": 0}, "--num-replicas must be >= 1"),
    ({"min_replicas": 3, "max_replicas": 2}, "--min-replicas <= --max-replicas"),
    ({"num_cpus_per_replica": 0}, "--num-cpus-per-replica must be > 0"),
    ({"no_such_arg": 1}, "unknown engine arguments"),
])
def test_build_app_rejects(kwargs: dict, message: str) -> None:
    from hearth.ray import build_app

    with pytest.raises(ValueError, match=message):
        build_app("some/model", **kwargs)


def test_build_app_accepts_autoscaling() -> None:
    from hearth.ray import build_app

    assert build_app("some/model", min_replicas=1, max_replicas=4, num_cpus_per_replica=1) is not None


def test_cli_ray_refuses_gateway_flags(capsys) -> None:
    from hearth.entrypoints.cli import main

    assert main(["serve", "--ray", "--upstream", "http://gpu:8000/v1"]) == 2
    assert "not available with --ray" in capsys.readouterr().err
