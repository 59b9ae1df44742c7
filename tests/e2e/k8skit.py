"""Helpers for the tests against the real control plane (tests/e2e): API clients, nodes and pods as a
kubelet-less cluster needs them, helm against the real API server, ServiceAccount tokens, and our own
components run as processes (the webhook, the device plugin) beside kubelet's device manager (dmharness).

Every process is started through `ControlPlane.spawn`, so it is stopped with the control plane.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import chartkit
import kubernetes
import pytest
import yaml

from gpuslice import config as config_
from gpuslice.deviceplugin import manager
from gpuslice.node import inventory, labels
from gpuslice.sim import controlplane, kube_components

REQUIRE_ENV = "GPUSLICE_REQUIRE_E2E"
EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "gpuslice" / "examples"
T = TypeVar("T")


def binaries_or_skip() -> controlplane.Binaries:
    """The built components; without them the test skips (one line), or fails where CI requires them."""
    found = controlplane.find_binaries()
    if found is not None:
        return found
    where = os.environ.get(controlplane.BIN_ENV)
    reason = (
        f"{controlplane.BIN_ENV}={where} lacks {', '.join(controlplane.BINARIES)}"
        if where
        else "real Kubernetes components not built (needs Go: `make e2e` builds them with e2e/k8s/build.sh)"
    )
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.2) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def api_client(kubeconfig: str) -> kubernetes.client.ApiClient:
    return kubernetes.config.new_client_from_config(config_file=kubeconfig)


def core(client: kubernetes.client.ApiClient) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(client)


def create_namespace(api: kubernetes.client.CoreV1Api, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    api.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


def api_error_message(exc: kubernetes.client.ApiException) -> str:
    """The message the API server gave a user (what kubectl would print)."""
    try:
        return str(json.loads(exc.body).get("message", exc.body))
    except (TypeError, ValueError):
        return str(exc.body)


# --- nodes and pods -----------------------------------------------------------------------------


def node_object(
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    allocatable: Mapping[str, str] | None = None,
    taints: Iterable[Mapping[str, str]] = (),
) -> dict[str, Any]:
    """A Node as a kubelet would register it, with no addresses (nothing may dial it). Status is accepted
    on create; `pods` must be set or every pod is 'Too many pods'."""
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", **(allocatable or {})}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"taints": list(taints)} if taints else {},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e"}],
        },
    }


def gpu_node_object(
    name: str,
    node: inventory.NodeInventory,
    *,
    settings: config_.Config | None = None,
    allocated: Mapping[str, int] | None = None,
    extra_labels: Mapping[str, str] | None = None,
    cpu: str = "64",
    taints: Iterable[Mapping[str, str]] = (),
) -> dict[str, Any]:
    """A GPU node as the device plugin and kubelet present it: the plugin's labels (node/labels.py)
    for `allocated` (GPU UUID -> units in use) and kubelet's allocatable of the plugin's resources."""
    settings = settings or config_.Config()
    contract = settings.contract
    node_labels = labels.node_labels(node, contract, allocated=allocated or {})
    node_labels[contract.label_node_enabled] = "true"
    allocatable = {r.name: str(len(r.device_ids)) for r in manager.build_resources(node, settings)}
    allocatable["cpu"] = cpu
    return node_object(name, labels={**node_labels, **(extra_labels or {})}, allocatable=allocatable, taints=taints)


def pod_object(
    name: str,
    *,
    annotations: Mapping[str, str] | None = None,
    limits: Mapping[str, Any] | None = None,
    requests: Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits:
        resources["limits"] = {k: str(v) for k, v in limits.items()}
    if requests:
        resources["requests"] = {k: str(v) for k, v in requests.items()}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(annotations or {}), "labels": dict(labels or {})},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/e2e:1", "resources": resources}], **spec},
    }


def with_string_quantities(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest with resource quantities as strings: YAML's `nvidia.com/gpu: 1` is an int, which the API
    server accepts but the Python client's model validation refuses before sending."""
    spec = manifest.get("spec", {})
    for container in [*spec.get("containers", []), *spec.get("initContainers", [])]:
        for kind in ("limits", "requests"):
            values = container.get("resources", {}).get(kind)
            if values:
                container["resources"][kind] = {k: str(v) for k, v in values.items()}
    return manifest


def bound_node(api: kubernetes.client.CoreV1Api, namespace: str, name: str, timeout: float = 60.0) -> str:
    """The node the scheduler bound a pod to (bound pods stay Pending: there is no kubelet)."""

    def probe() -> str | None:
        return api.read_namespaced_pod(name, namespace).spec.node_name

    return wait_for(f"pod {namespace}/{name} to be bound", probe, timeout)


def all_running(
    api: kubernetes.client.CoreV1Api, namespace: str, names: list[str], what: str, timeout: float = 180.0
) -> list[Any]:
    """The pods `names` once every one is Running (the node agent writes that status)."""

    def probe() -> list[Any] | None:
        pods = {p.metadata.name: p for p in api.list_namespaced_pod(namespace).items}
        ready = [pods[n] for n in names if n in pods and pods[n].status.phase == "Running"]
        return ready if len(ready) == len(names) else None

    return wait_for(what, probe, timeout, interval=0.5)


def scheduling_failure(
    api: kubernetes.client.CoreV1Api, namespace: str, name: str, timeout: float = 60.0, *, containing: str = ""
) -> str:
    """The scheduler's PodScheduled=False message for a pod it cannot place; with `containing`, the
    first such message that contains it (an earlier attempt may have failed for a passing reason,
    such as a claim its informer had not seen yet, and the scheduler retries)."""
    last = ""

    def probe() -> str | None:
        nonlocal last
        pod = api.read_namespaced_pod(name, namespace)
        for condition in pod.status.conditions or ():
            if condition.type == "PodScheduled" and condition.status == "False" and condition.message:
                last = str(condition.message)
                return last if containing in last else None
        return None

    try:
        return wait_for(f"the scheduler to give up on {namespace}/{name}", probe, timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; its last message: {last!r}, wanted one containing {containing!r}") from None


# --- identities -----------------------------------------------------------------------------------


def service_account_token(
    api: kubernetes.client.CoreV1Api, namespace: str, account: str, *, bound_pod: Any | None = None
) -> str:
    """A TokenRequest token for a ServiceAccount; bound to `bound_pod` it carries the pod's node name, as
    the token kubelet mounts into that pod does."""
    spec: dict[str, Any] = {"audiences": [], "expirationSeconds": 3600}
    if bound_pod is not None:
        spec["boundObjectRef"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": bound_pod.metadata.name,
            "uid": bound_pod.metadata.uid,
        }
    token = api.create_namespaced_service_account_token(
        account, namespace, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    )
    return str(token.status.token)


# --- helm ---------------------------------------------------------------------------------------


def helm(kubeconfig: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """The pinned helm against the real API server."""
    result = chartkit.run_helm(*args, "--kubeconfig", kubeconfig, env={"KUBECONFIG": kubeconfig})
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}{result.stdout}")
    return result


def install_chart(
    kubeconfig: str,
    release: str,
    namespace: str,
    values: Mapping[str, Any],
    tmp: pathlib.Path,
    *,
    upgrade: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`helm install` (or `helm upgrade`) of charts/gpuslice; no --wait: no kubelet ever runs its pods.
    The chart has no default image: values that name none get chartkit.TEST_IMAGE (never pulled here)."""
    values_file = tmp / f"{release}-values.json"
    values_file.write_text(json.dumps(chartkit.with_test_image(values)))
    verb = ["upgrade", release] if upgrade else ["install", release, "--create-namespace"]
    return helm(kubeconfig, *verb, str(chartkit.CHART), "--namespace", namespace, "-f", str(values_file))


# --- our components as processes -----------------------------------------------------------------


def free_port() -> int:
    return controlplane.free_port()


@dataclasses.dataclass
class Webhook:
    """gpuslice-webhook serving HTTPS on 127.0.0.1 with the chart's certificate and configuration."""

    port: int
    process: Any

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"


def start_webhook(
    plane: controlplane.ControlPlane,
    name: str,
    *,
    tls_secret: Any,
    config_yaml: str,
    kubeconfig: str,
    port: int,
    extra_args: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
) -> Webhook:
    """Runs the webhook with the certificate from the chart's TLS Secret, the chart's config.yaml and a
    kubeconfig for its node watch, and waits until it answers over HTTPS with that certificate."""
    directory = plane.workdir / name
    directory.mkdir(exist_ok=True)
    for key in ("tls.crt", "tls.key", "ca.crt"):
        (directory / key).write_bytes(base64.b64decode(tls_secret.data[key]))
    (directory / "config.yaml").write_text(config_yaml)
    argv = kube_components.webhook_argv(directory, port, kubeconfig, log_level=None, extra=extra_args)
    process = plane.spawn(name, argv, env={"PYTHONUNBUFFERED": "1", **(env or {})})
    cafile = str(directory / "ca.crt")

    def ready() -> bool:
        if process.popen.poll() is not None:
            raise AssertionError(f"the webhook exited ({process.popen.returncode}):\n{process.tail()}")
        status, _ = controlplane._https_get(f"https://127.0.0.1:{port}/readyz", cafile)
        return status == 200

    wait_for("the webhook to be ready", lambda: _quietly(ready), timeout=60)
    return Webhook(port, process)


def _quietly(probe: Callable[[], bool]) -> bool:
    try:
        return probe()
    except OSError:
        return False


class Harness:
    """dmharness: kubelet's real device manager with a loopback test API and kubelet's PodResources server."""

    def __init__(self, plane: controlplane.ControlPlane, directory: pathlib.Path, name: str = "dmharness") -> None:
        self.plane = plane
        self.name = name
        # Unix socket paths are limited to 107 bytes: the sockets live in a short directory of their own.
        self.root = pathlib.Path(tempfile.mkdtemp(prefix="gs-kubelet-", dir="/tmp"))
        self.socket_dir = self.root / "device-plugins"
        self.pod_resources_socket = self.root / "pod-resources" / "kubelet.sock"
        self.state_file = directory / "harness-pods.json"
        self.process: Any = None
        self.base = ""

    def start(self) -> Harness:
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        self.pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.process = self.plane.spawn(
            self.name,
            [
                str(self.plane.binaries.path("dmharness")),
                f"--socket-dir={self.socket_dir}",
                f"--listen=127.0.0.1:{port}",
                f"--state-file={self.state_file}",
                f"--pod-resources-socket={self.pod_resources_socket}",
                "--v=2",
            ],
        )
        self.base = f"http://127.0.0.1:{port}"

        def listening() -> bool:
            if self.process.popen.poll() is not None:
                raise AssertionError(f"dmharness exited ({self.process.popen.returncode}):\n{self.process.tail()}")
            return _quietly(lambda: self._get("/healthz")[0] == 200)

        wait_for("dmharness to listen", listening, timeout=30)
        wait_for("kubelet.sock", lambda: (self.socket_dir / "kubelet.sock").exists(), timeout=30)
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.plane.stop_process(self.process)
            self.process = None

    def close(self) -> None:
        """Stop, and remove the socket directory."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def restart(self) -> None:
        """Kubelet restarts: the manager stops, starts again from its checkpoint and our state file."""
        self.stop()
        self.start()

    def _request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - loopback
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def _get(self, path: str) -> tuple[int, Any]:
        return self._request("GET", path)

    def capacity(self) -> dict[str, Any]:
        status, body = self._get("/capacity")
        assert status == 200, body
        return dict(body)

    def allocatable(self, resource: str) -> int:
        return int(self.capacity()["allocatable"].get(resource, "0"))

    def admit(self, pod: Mapping[str, Any]) -> tuple[int, Any]:
        """Kubelet admits a pod: (200, containers' devices and runtime options) or (409, kubelet's error)."""
        return self._request("POST", "/admit", pod)

    def remove(self, uid: str) -> None:
        status, body = self._request("POST", f"/remove?uid={uid}")
        assert status == 204, body


@dataclasses.dataclass
class DevicePlugin:
    process: Any
    http_port: int


def start_device_plugin(
    plane: controlplane.ControlPlane,
    harness: Harness,
    node_file: pathlib.Path,
    *,
    name: str = "device-plugin",
    node_name: str = "",
    kubeconfig: str | None = None,
    extra_args: Iterable[str] = (),
) -> DevicePlugin:
    """gpuslice-device-plugin on a node file, registering with the harness's kubelet.sock."""
    http_port = free_port()
    env = {"PYTHONUNBUFFERED": "1"}
    if kubeconfig:
        env["KUBECONFIG"] = kubeconfig
    process = plane.spawn(
        name,
        [
            sys.executable,
            "-m",
            "gpuslice.deviceplugin.main",
            f"--node-file={node_file}",
            f"--kubelet-dir={harness.socket_dir}",
            f"--pod-resources-socket={harness.pod_resources_socket}",
            f"--http-port={http_port}",
            f"--node-name={node_name}",
            *extra_args,
        ],
        env=env,
    )
    return DevicePlugin(process, http_port)


def pod_for_harness(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A pod as kubelet sees it after binding: with a UID (the API server's, or a fresh one)."""
    copy = json.loads(json.dumps(pod))
    copy.setdefault("metadata", {}).setdefault("uid", str(uuid.uuid4()))
    copy["metadata"].setdefault("namespace", "default")
    return copy


def unix_socket_alive(path: pathlib.Path) -> bool:
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def dump(obj: Any) -> str:
    return yaml.safe_dump(kubernetes.client.ApiClient().sanitize_for_serialization(obj))
