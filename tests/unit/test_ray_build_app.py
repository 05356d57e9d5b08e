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


@pytest.mark.parametrize("argv, message", [
    (["--upstream", "gpu:8000"], "--upstream must be an http:// or https:// URL"),
    (["--api-key-file", "/no/such/keys.toml"], "--api-key-file /no/such/keys.toml: no such file"),
    (["--api-key", "k", "--api-key-file", "keys.toml"], "--api-key and --api-key-file both given"),
])
def test_cli_ray_checks_key_file_and_gateway_flags_before_ray(argv: list[str], message: str, capsys) -> None:
    from hearth.entrypoints.cli import main

    assert main(["serve", "--ray", *argv]) == 2
    assert message in capsys.readouterr().err
