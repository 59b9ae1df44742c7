"""`gpuslice-controller`'s wiring (controller/main.py) over the runtime: its watches, then the
campaign that begins once they have listed and gives the Lease up first on shutdown. The
controller against a real API server: tests/e2e/test_real_upgrade.py and the replay."""

from __future__ import annotations

import dataclasses

import kubernetes
import pytest

from gpuslice import config
from gpuslice.controller import main

PACED = dataclasses.replace(config.Config(), pacing=config.PacingConfig(enabled=True))


def offline_api() -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(kubernetes.client.Configuration()))


def test_the_watches_come_first_and_the_campaign_last_so_it_is_stopped_first() -> None:
    args = main.build_parser().parse_args(["--identity", "me", "--port", "0"])
    parts, health = main.runnables(args, PACED, offline_api())
    assert [part.name for part in parts] == ["requeuer", "pacer", "leader-election"]
    assert health.port == 0 and health.checks is not None
    assert health.checks() == {"requeuer": False, "pacer": False}  # nothing listed yet: not ready


def test_without_pacing_only_the_requeuer_watches() -> None:
    args = main.build_parser().parse_args(["--identity", "me"])
    parts, _ = main.runnables(args, config.Config(), offline_api())
    assert [part.name for part in parts] == ["requeuer", "leader-election"]


@pytest.mark.parametrize(
    ("environ", "flags", "why"),
    [
        ({"GPUSLICE_DRA_ENABLED": "true"}, [], "dra.enabled is true"),
        ({}, ["--requeue-enabled=false"], "requeue.enabled and pacing.enabled are both false"),
    ],
    ids=["dra-mode", "both-off"],
)
def test_a_controller_with_nothing_to_do_says_why_and_exits_2(
    environ: dict[str, str], flags: list[str], why: str, tmp_path, monkeypatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: x}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
        "current-context: c\n"
    )
    assert main.main(["--kubeconfig", str(kubeconfig), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and why in err
