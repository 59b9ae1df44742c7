"""The processes a replay on the real control plane runs beside etcd, kube-apiserver and
kube-scheduler: the scheduler's configuration, our webhook (one process, or replicas behind the
round-robin proxy, sim/rrproxy.py) with the MutatingWebhookConfiguration that calls it, and the
controller (leader, standby). The end-to-end tests and benchmarks start the controller this way too.

May import PyYAML, gpuslice.config and the other gpuslice.sim modules; the components run as
`python -m gpuslice.<component>.main`.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import operator
import os
import pathlib
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from gpuslice import config
from gpuslice.sim import chaos as chaos_
from gpuslice.sim import controlplane, kube_api, kube_outcomes, scheduler

WEBHOOK_NAME = "gpuslice-sim"


REQUEUE_BACKOFF_SECONDS = 0.1  # the controller's first requeue delay here (x2 each time, 5 at most: 3.1 s)


LEADING = b"\ngpuslice_controller_leading 1.0"  # a controller's /metrics while it leads


def scheduler_configuration(profile: scheduler.Profile) -> dict[str, Any]:
    """The KubeSchedulerConfiguration the model's profile stands for."""
    entry: dict[str, Any] = {"schedulerName": profile.name}
    if profile.percentage_of_nodes_to_score:
        entry["percentageOfNodesToScore"] = profile.percentage_of_nodes_to_score
    profiles = [entry]
    if profile.name != "default-scheduler":
        strategy: dict[str, Any] = {
            "type": profile.strategy,
            "resources": [{"name": r, "weight": w} for r, w in profile.resources],
        }
        if profile.strategy == "RequestedToCapacityRatio":
            strategy["requestedToCapacityRatio"] = {
                "shape": [{"utilization": 0, "score": 0}, {"utilization": 100, "score": 10}]
            }
        entry["pluginConfig"] = [{"name": "NodeResourcesFit", "args": {"scoringStrategy": strategy}}]
        # The model scores every pod with the one profile; the webhook names this one only on the
        # pods it converts, so the others (CPU-only pods) get a default-scheduler scored the same way.
        profiles.append({**entry, "schedulerName": "default-scheduler"})
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": profiles,
    }


def settings_document(settings: config.Config) -> dict[str, Any]:
    """The Config as a config.yaml document (docs/configuration.md), for the webhook process."""
    document: dict[str, Any] = {}
    for field in config.FIELDS:
        value = operator.attrgetter(field.attr)(settings)
        if isinstance(value, tuple):
            value = list(value)
        head, _, tail = field.path.partition(".")
        if tail:
            document.setdefault(head, {})[tail] = value
        else:
            document[head] = value
    return document


def webhook_files(plane: controlplane.ControlPlane, directory: pathlib.Path, document: Mapping[str, Any]) -> None:
    """A webhook's serving certificate from the plane's CA (tls.crt, tls.key) and its
    configuration (config.yaml, `document`), in `directory`."""
    directory.mkdir(exist_ok=True)
    cert, key = plane.pki.issue("gpuslice-webhook", ips=("127.0.0.1",), dns=("localhost",))
    (directory / "tls.crt").write_bytes(cert)
    (directory / "tls.key").write_bytes(key)
    (directory / "tls.key").chmod(0o600)
    (directory / "config.yaml").write_text(yaml.safe_dump(dict(document)))


def webhook_argv(
    directory: pathlib.Path,
    port: int,
    kubeconfig: str,
    *,
    python_flags: Sequence[str] = (),
    log_level: str | None = "WARNING",
    extra: Sequence[str] = (),
) -> list[str]:
    """The webhook's command line on 127.0.0.1:`port` with `webhook_files`' files in `directory`
    (the end-to-end tests write their own, from the chart's Secret); `log_level` None: its default."""
    return [
        sys.executable,
        *python_flags,
        "-m",
        "gpuslice.webhook.main",
        f"--config={directory / 'config.yaml'}",
        f"--tls-cert-file={directory / 'tls.crt'}",
        f"--tls-private-key-file={directory / 'tls.key'}",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--kubeconfig={kubeconfig}",
        *([f"--log-level={log_level}"] if log_level else []),
        *extra,
    ]


def controller_argv(
    config_file: str | os.PathLike[str],
    port: int,
    kubeconfig: str,
    *,
    identity: str,
    log_level: str = "WARNING",
    python_flags: Sequence[str] = (),
) -> list[str]:
    """`gpuslice-controller`'s command line on 127.0.0.1:`port`."""
    return [
        sys.executable,
        *python_flags,
        "-m",
        "gpuslice.controller.main",
        f"--config={config_file}",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--kubeconfig={kubeconfig}",
        f"--identity={identity}",
        f"--log-level={log_level}",
    ]


def _start_webhook(
    plane: controlplane.ControlPlane, settings: config.Config, name: str = "webhook"
) -> tuple[Any, int, bytes]:
    """The webhook process with a serving certificate from the plane's CA; (process, port, CA PEM)."""
    directory = plane.workdir / name
    document = settings_document(settings)
    # The controller (which reads this file too) recreates refused pods, as in a cluster; quickly,
    # so that a burst's last recreation comes well inside the quiet time that ends the run.
    document["requeue"]["backoffSeconds"] = REQUEUE_BACKOFF_SECONDS
    webhook_files(plane, directory, document)
    port = controlplane.free_port()
    argv = webhook_argv(directory, port, str(plane.admin_kubeconfig))
    process = plane.spawn(name, argv, env={"PYTHONUNBUFFERED": "1"})
    plane._wait(process, f"gpuslice {name}", functools.partial(_webhook_ready, plane, port), timeout=60)
    return process, port, plane.pki.ca_pem


def _webhook_ready(plane: controlplane.ControlPlane, port: int) -> bool:
    status, _ = controlplane._https_get(f"https://127.0.0.1:{port}/readyz", plane.ca_file)
    return status == 200


def start_webhooks(
    plane: controlplane.ControlPlane, settings: config.Config, replicas: int | None
) -> tuple[int, bytes, list[chaos_.Target]]:
    """The webhook, or (`replicas`) that many webhook processes behind a round-robin TCP proxy
    (sim/rrproxy.py), as a Service spreads the API server's connections over a Deployment's pods
    (one replica behind it too, so that a comparison differs in the replicas alone); (port the API
    server calls, CA PEM, each replica with its own port)."""
    if replicas is None:
        process, port, ca_pem = _start_webhook(plane, settings)
        return port, ca_pem, [chaos_.Target("webhook", process, port)]
    started = []
    for i in range(replicas):
        name = "webhook" if i == 0 else f"webhook-{i}"
        process, backend, ca_pem = _start_webhook(plane, settings, name)
        started.append(chaos_.Target(name, process, backend))
    ports = [t.port for t in started]
    port = controlplane.free_port()
    proxy = plane.spawn(
        "webhook-proxy",
        [
            sys.executable,
            "-m",
            "gpuslice.sim.rrproxy",
            f"--listen=127.0.0.1:{port}",
            *(f"--backend=127.0.0.1:{p}" for p in ports),
        ],
    )

    plane._wait(proxy, "the webhook proxy", functools.partial(_webhook_ready, plane, port), timeout=30)
    return port, ca_pem, started


def start_controller(
    plane: controlplane.ControlPlane,
    config_file: str | os.PathLike[str],
    kubeconfig: str,
    *,
    name: str = "controller",
    env: Mapping[str, str] | None = None,
    log_level: str = "WARNING",
) -> tuple[Any, int]:
    """`gpuslice-controller` as its own process on 127.0.0.1 with `name` as its identity, once its
    watches have listed (leading or standing by); (process, HTTP port). The replay and the
    end-to-end tests both start it this way."""
    port = controlplane.free_port()
    argv = controller_argv(config_file, port, kubeconfig, identity=name, log_level=log_level)
    process = plane.spawn(name, argv, env={"PYTHONUNBUFFERED": "1", **(env or {})})
    plane._wait(process, f"gpuslice {name}", functools.partial(controller_answers, port, "/readyz"), timeout=60)
    return process, port


def controller_answers(port: int, path: str, expected: bytes = b"") -> bool:
    """Whether the controller at `port` answers `path` with 200 (and a body containing `expected`)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as answer:  # noqa: S310
            return bool(answer.status == 200) and expected in answer.read()
    except OSError:
        return False


def start_replay_controllers(
    plane: controlplane.ControlPlane, webhook_ports: Sequence[int], pacing: bool, *, standby: bool = False
) -> list[chaos_.Target]:
    """The controller on the webhook's config.yaml, as the chart runs it, once it leads (with no
    POD_NAMESPACE its Lease and journal are in "default"); with pacing, once every webhook replica
    (`webhook_ports`, each asked directly) has seen its Lease renewed, so that the burst is gated
    from its first pod. `standby`: a second replica too, once its views are listed (for --chaos)."""
    config_file = plane.workdir / "webhook" / "config.yaml"
    start = functools.partial(
        start_controller,
        plane,
        config_file,
        str(plane.admin_kubeconfig),
        log_level=os.environ.get("GPUSLICE_SIM_CONTROLLER_LOG", "WARNING"),
    )
    process, port = start()
    leading = functools.partial(controller_answers, port, "/metrics", LEADING)
    plane._wait(process, "the controller to lead", leading, timeout=60)
    started = [chaos_.Target("controller", process, port)]
    if pacing:

        def gating() -> bool:
            for port in webhook_ports:
                status, body = controlplane._https_get(f"https://127.0.0.1:{port}/metrics", plane.ca_file)
                if status != 200 or b"\ngpuslice_webhook_pacer_alive 1.0" not in body:
                    return False
            return True

        plane._wait(process, "the webhook to see the controller's Lease", gating, timeout=60)
    if standby:
        name = "controller-standby"
        process, port = start(name=name)
        started.append(chaos_.Target(name, process, port))
    return started


def webhook_configuration(port: int, ca_pem: bytes, *, side_effects: str = "None") -> dict[str, Any]:
    """One entry for every pod of the replay's namespace: the model hands every pod to `mutate` too.
    (The chart splits GPU pods and CPU pods into two entries by matchConditions; the webhook gives
    each pod the same answer either way.) In DRA mode the webhook creates claim templates, except on
    dry runs: `NoneOnDryRun`."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_NAME},
        "webhooks": [
            {
                "name": "pods.gpuslice.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": side_effects,
                "timeoutSeconds": 10,
                "failurePolicy": "Fail",
                "reinvocationPolicy": "Never",
                "matchPolicy": "Equivalent",
                "clientConfig": {
                    "url": f"https://127.0.0.1:{port}/mutate",
                    "caBundle": base64.b64encode(ca_pem).decode(),
                },
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "namespaceSelector": {
                    "matchExpressions": [
                        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [kube_outcomes.NAMESPACE]}
                    ]
                },
            }
        ],
    }


async def webhook_in_effect(api: kube_api.Api, contract_probe: dict[str, Any], timeout: float = 30.0) -> None:
    """Until the API server sends pods to the webhook (it loads the configuration asynchronously):
    a dry-run create of a share comes back converted."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = await api.create(f"/api/v1/namespaces/{kube_outcomes.NAMESPACE}/pods", contract_probe, dry_run=True)
        limits = answer["spec"]["containers"][0].get("resources", {}).get("limits", {})
        if any(k not in ("cpu", "memory") for k in limits) or answer["spec"].get("resourceClaims"):
            return  # extended resources (device-plugin mode) or a claim (DRA mode)
        await asyncio.sleep(0.2)
    raise controlplane.ControlPlaneError("the API server never called the webhook (dry-run pod not converted)")
