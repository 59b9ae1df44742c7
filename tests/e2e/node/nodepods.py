"""Pods for the real-node tests and the waits around them: pods in the shapes users write (KAI's
annotations) running the locally made busybox image, which prints its environment and device nodes
and then sleeps, so a test reads from the log what the container was given."""

from __future__ import annotations

import copy
import pathlib
from collections.abc import Mapping
from typing import Any

import k8skit
import kubernetes
import realnode

from gpuslice import contract as contract_

CONTRACT = contract_.Contract()
REPORT = 'env | sort; echo "devices: $(ls /dev | grep nvidia | tr "\\n" " ")"; echo END-OF-REPORT; sleep 3600'


def kai_pod(
    name: str,
    annotations: Mapping[str, str],
    *,
    limits: Mapping[str, str] | None = None,
    spec: Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
    image: str = "localhost/busybox:1",
    command: str = REPORT,
) -> dict[str, Any]:
    """A pod as KAI's users write one (annotations, and often `nvidia.com/gpu: 1` as a placeholder)."""
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(annotations), "labels": dict(labels or {})},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", command],
                    "resources": {"limits": dict(limits or {})},
                }
            ],
        },
    }
    pod["spec"].update(copy.deepcopy(dict(spec or {})))
    return pod


def running(core: kubernetes.client.CoreV1Api, namespace: str, name: str, timeout: float = 90) -> Any:
    def probe() -> Any:
        pod = core.read_namespaced_pod(name, namespace)
        if pod.status.phase in ("Failed", "Succeeded"):
            raise AssertionError(
                f"{namespace}/{name} ended {pod.status.phase}: {pod.status.reason} {pod.status.message}"
            )
        statuses = pod.status.container_statuses or []
        return pod if pod.status.phase == "Running" and statuses and all(s.ready for s in statuses) else None

    return wait_for_pods(core, namespace, name, f"{namespace}/{name} Running", probe, timeout)


def report(core: kubernetes.client.CoreV1Api, namespace: str, name: str, container: str = "main") -> dict[str, str]:
    """What a pod running REPORT printed: its environment, and `devices` (the /dev/nvidia* it sees)."""
    log = k8skit.wait_for(
        f"the report of {namespace}/{name}",
        lambda: (lambda text: text if "END-OF-REPORT" in text else None)(
            core.read_namespaced_pod_log(name, namespace, container=container)
        ),
        30,
    )
    values: dict[str, str] = {}
    for line in log.splitlines():
        key, sep, value = line.partition("=") if not line.startswith("devices:") else ("devices", "=", line[8:])
        if sep:
            values[key] = value.strip() if key == "devices" else value
    return values


def node_labels(core: kubernetes.client.CoreV1Api) -> dict[str, str]:
    return dict(core.read_node(realnode.NODE_NAME).metadata.labels or {})


def allocatable(core: kubernetes.client.CoreV1Api) -> dict[str, str]:
    return dict(core.read_node(realnode.NODE_NAME).status.allocatable or {})


def wait_for_label(core: kubernetes.client.CoreV1Api, key: str, value: str, timeout: float = 60) -> None:
    k8skit.wait_for(f"node label {key}={value}", lambda: node_labels(core).get(key) == value or None, timeout)


def ready_pods(core: kubernetes.client.CoreV1Api, namespace: str, prefix: str) -> list[Any]:
    return [
        p
        for p in core.list_namespaced_pod(namespace).items
        if p.metadata.name.startswith(prefix)
        and p.metadata.deletion_timestamp is None
        and p.status.phase == "Running"
        and all(s.ready for s in p.status.container_statuses or [])
    ]


def describe(core: kubernetes.client.CoreV1Api, namespace: str, prefix: str = "") -> str:
    """The state of a namespace's pods (phase, each container's waiting or ended reason, restarts)
    and its Warning events: what a failed wait names, so a CI log says why a pod was not Ready."""
    lines = []
    for pod in core.list_namespaced_pod(namespace).items:
        if not pod.metadata.name.startswith(prefix):
            continue
        containers = []
        for status in [*(pod.status.init_container_statuses or []), *(pod.status.container_statuses or [])]:
            state = status.state
            detail = (
                f"waiting {state.waiting.reason}: {state.waiting.message or ''}".strip()
                if state.waiting
                else f"ended {state.terminated.reason} ({state.terminated.exit_code})"
                if state.terminated
                else "running"
            )
            containers.append(f"{status.name} {detail}, ready={status.ready}, restarts={status.restart_count}")
        lines.append(f"{pod.metadata.name}: {pod.status.phase} on {pod.spec.node_name}; " + "; ".join(containers))
    warnings = core.list_namespaced_event(namespace, field_selector="type=Warning").items
    lines += [f"Warning {e.reason} {e.involved_object.name}: {e.message}" for e in warnings[-15:]]
    return "\n".join(lines) or f"no pods in {namespace}"


def wait_for_pods(
    core: kubernetes.client.CoreV1Api, namespace: str, prefix: str, what: str, probe: Any, timeout: float
) -> Any:
    """k8skit.wait_for, failing with `describe` of the pods it waited for."""
    try:
        return k8skit.wait_for(what, probe, timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{describe(core, namespace, prefix)}") from None


def events_of(core: kubernetes.client.CoreV1Api, namespace: str, name: str) -> list[Any]:
    selector = f"involvedObject.name={name}"
    return list(core.list_namespaced_event(namespace, field_selector=selector).items)


def pod_pids(pod_uid: str, command: str) -> list[int]:
    """Host PIDs of the pod's processes named `command` (kubelet's cgroupfs layout names the pod by
    UID in every hierarchy), read from /proc as the usage monitor reads them."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "cgroup").read_text()
            name = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if f"/pod{pod_uid}/" in text and "/kubepods" in text and name == command:
            found.append(int(entry.name))
    return sorted(found)


class Release:
    """charts/gpuslice installed on the real node by helm, as a user would (no webhook.externalURL:
    the webhook runs as the chart's pods)."""

    def __init__(self, node: realnode.RealNode, core: kubernetes.client.CoreV1Api, name: str, namespace: str) -> None:
        self.node = node
        self.core = core
        self.name = name
        self.namespace = namespace
        self.values: dict[str, Any] = {}

    @property
    def fullname(self) -> str:
        return f"{self.name}-gpuslice"

    def install(self, values: dict[str, Any], *, upgrade: bool = False) -> None:
        self.values = values
        directory = self.node.workdir / "helm"
        directory.mkdir(exist_ok=True)
        k8skit.install_chart(
            self.node.plane.admin_kubeconfig, self.name, self.namespace, values, directory, upgrade=upgrade
        )

    def uninstall(self) -> None:
        k8skit.helm(
            self.node.plane.admin_kubeconfig, "uninstall", self.name, "--namespace", self.namespace, check=False
        )
        k8skit.wait_for(
            f"the pods of release {self.name} gone",
            lambda: not self.core.list_namespaced_pod(self.namespace).items,
            timeout=120,
        )

    def wait_ready(self, component: str, count: int = 1, timeout: float = 120) -> list[Any]:
        """`count` Ready pods of the chart's `component` (device-plugin, webhook, dra-plugin, ...)."""
        prefix = f"{self.fullname}-{component}-"
        return wait_for_pods(
            self.core,
            self.namespace,
            prefix,
            f"{count} Ready pod(s) of {prefix}*",
            lambda: (lambda pods: pods if len(pods) == count else None)(ready_pods(self.core, self.namespace, prefix)),
            timeout,
        )

    def rolled(self, component: str, old: set[str], count: int = 1, timeout: float = 180) -> list[Any]:
        """After an upgrade: `count` Ready pods of `component`, none of them one of `old` (names)."""
        prefix = f"{self.fullname}-{component}-"

        def probe() -> list[Any] | None:
            pods = self.core.list_namespaced_pod(self.namespace).items
            mine = [p for p in pods if p.metadata.name.startswith(prefix)]
            if any(p.metadata.name in old for p in mine):
                return None
            ready = ready_pods(self.core, self.namespace, prefix)
            return ready if len(ready) == count == len(mine) else None

        return wait_for_pods(self.core, self.namespace, prefix, f"{prefix}* rolled out", probe, timeout)
