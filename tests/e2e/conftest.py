"""Fixtures for the tests against the real control plane: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager of the Kubernetes version in e2e/k8s/go.mod, started once per session on
127.0.0.1 (sim/controlplane.py) and stopped at its end, no process left behind.

Without the built components ($GPUSLICE_K8S_BIN, set by `make test` / `make e2e` when Go is present)
every test here skips with one line; with GPUSLICE_REQUIRE_E2E=1 (CI) they fail instead.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import k8skit
import kubernetes
import pytest

from gpuslice.node import nodefile
from gpuslice.sim import controlplane, kube_components

HERE = pathlib.Path(__file__).resolve().parent
_NOT_RUN: list[pytest.Item] = []


def pytest_report_header(config: pytest.Config) -> str:
    found = controlplane.find_binaries()
    if found is None:
        return "real Kubernetes: not built (tests/e2e skip; CI requires them)"
    return f"real Kubernetes: {found.version} from {found.directory}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without the components (and where they are not required) the e2e tests are left out as one
    group, summed up in one line at the end, instead of one skip line per test."""
    if controlplane.find_binaries() is not None or os.environ.get(k8skit.REQUIRE_ENV) == "1":
        return
    _NOT_RUN[:] = [item for item in items if HERE in item.path.parents]
    if _NOT_RUN:
        items[:] = [item for item in items if HERE not in item.path.parents]
        config.hook.pytest_deselected(items=_NOT_RUN)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _NOT_RUN:
        terminalreporter.write_line(
            f"SKIPPED {len(_NOT_RUN)} tests against real Kubernetes (tests/e2e): the components are not built "
            "(needs Go; `make e2e` builds them with e2e/k8s/build.sh)",
            yellow=True,
        )


@pytest.fixture(scope="session")
def k8s_binaries() -> controlplane.Binaries:
    return k8skit.binaries_or_skip()


@pytest.fixture(scope="session")
def cluster(
    k8s_binaries: controlplane.Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[controlplane.ControlPlane]:
    plane = controlplane.ControlPlane(k8s_binaries, tmp_path_factory.mktemp("k8s"))
    try:
        plane.start()
    except controlplane.ControlPlaneError as exc:
        pytest.fail(f"the real control plane did not start: {exc}", pytrace=False)
    try:
        yield plane
    finally:
        dials = plane.foreign_dials()
        plane.stop()
    assert not dials, "a component dialled outside loopback:\n" + "\n".join(dials)


@pytest.fixture(scope="session")
def admin(cluster: controlplane.ControlPlane) -> kubernetes.client.ApiClient:
    return k8skit.api_client(cluster.admin_kubeconfig)


@pytest.fixture(scope="session")
def core(admin: kubernetes.client.ApiClient) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(admin)


@pytest.fixture
def namespace(core: kubernetes.client.CoreV1Api, request: pytest.FixtureRequest) -> str:
    """A fresh namespace for one test (never reused: a test's leftovers cannot reach another)."""
    prefix = request.node.name.split("[")[0].replace("_", "-")[:40].strip("-")
    return k8skit.create_namespace(core, prefix or "e2e")


@pytest.fixture
def workdir(cluster: controlplane.ControlPlane, request: pytest.FixtureRequest) -> pathlib.Path:
    path = cluster.workdir / request.node.name.replace("/", "_")[:80]
    path.mkdir(exist_ok=True)
    return path


def metric_sum(text: str, name: str) -> float:
    """Prometheus metric `name` in an exposition `text`, summed over its labels."""
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith((f"{name}{{", f"{name} "))
    )


@dataclasses.dataclass
class Controller:
    """A gpuslice-controller process: its HTTP port and identity in the Lease."""

    process: Any
    port: int
    identity: str

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as answer:  # noqa: S310
            return metric_sum(answer.read().decode(), name)

    @property
    def leading(self) -> bool:
        return self.metric("gpuslice_controller_leading") == 1


@dataclasses.dataclass
class Release:
    """charts/gpuslice installed with webhook.externalURL, and the webhook it points at running here as a
    process with the chart's certificate, the chart's config.yaml and its ServiceAccount's identity;
    the controller too, as a process with its ServiceAccount's identity (no kubelet runs pods here)."""

    plane: controlplane.ControlPlane
    core: kubernetes.client.CoreV1Api
    name: str
    namespace: str
    port: int
    values: dict[str, Any]
    directory: pathlib.Path
    webhook: k8skit.Webhook | None = None
    controllers: list[Controller] = dataclasses.field(default_factory=list)

    @property
    def fullname(self) -> str:
        return f"{self.name}-gpuslice"

    def config_yaml(self) -> str:
        config_map = self.core.read_namespaced_config_map(f"{self.fullname}-config", self.namespace)
        return str(config_map.data["config.yaml"])

    def kubeconfig_of(self, account: str, *, bound_pod: Any = None) -> str:
        token = k8skit.service_account_token(self.core, self.namespace, account, bound_pod=bound_pod)
        return self.plane.write_kubeconfig(f"{account}-{uuid.uuid4().hex[:6]}", token=token)

    def start_webhook(self) -> k8skit.Webhook:
        secret = self.core.read_namespaced_secret(f"{self.fullname}-webhook-tls", self.namespace)
        self.webhook = k8skit.start_webhook(
            self.plane,
            f"webhook-{self.name}",
            tls_secret=secret,
            config_yaml=self.config_yaml(),
            kubeconfig=self.kubeconfig_of(f"{self.fullname}-webhook"),
            port=self.port,
            env={"POD_NAMESPACE": self.namespace},  # as the chart's downward API gives it
        )
        return self.webhook

    def stop_webhook(self) -> None:
        if self.webhook is not None:
            self.plane.stop_process(self.webhook.process)
            self.webhook = None

    def start_controller(self, identity: str = "controller-0") -> Controller | None:
        """A controller replica on the chart's config.yaml, with its ServiceAccount and namespace, once
        its watches have listed; None where the chart runs no controller."""
        account = f"{self.fullname}-controller"
        try:
            self.core.read_namespaced_service_account(account, self.namespace)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        directory = self.directory / identity
        directory.mkdir(exist_ok=True)
        (directory / "config.yaml").write_text(self.config_yaml())
        process, port = kube_components.start_controller(
            self.plane,
            directory / "config.yaml",
            self.kubeconfig_of(account),
            name=f"{identity}-{self.name}",
            env={"POD_NAMESPACE": self.namespace},  # as the chart's downward API gives it
            log_level="DEBUG",
        )
        controller = Controller(process, port, f"{identity}-{self.name}")
        self.controllers.append(controller)
        return controller

    def stop_controller(self, controller: Controller) -> None:
        self.plane.stop_process(controller.process)
        self.controllers.remove(controller)

    def upgrade(self, values: dict[str, Any]) -> None:
        """`helm upgrade` with new values, then the webhook and a controller restarted on the new config.yaml."""
        self.values = values
        k8skit.install_chart(
            self.plane.admin_kubeconfig, self.name, self.namespace, values, self.directory, upgrade=True
        )
        self.stop_webhook()
        for controller in list(self.controllers):
            self.stop_controller(controller)
        self.start_webhook()
        self.start_controller()

    def admissions(self) -> float:
        """AdmissionReviews the webhook has answered so far (its own Prometheus counter)."""
        return self.metric("gpuslice_webhook_admissions_total")

    def metric(self, name: str) -> float:
        """The webhook's metric `name`, summed over its labels, read from its /metrics."""
        assert self.webhook is not None
        cafile = str(self.plane.workdir / f"webhook-{self.name}" / "ca.crt")
        status, body = controlplane._https_get(self.webhook.url + "/metrics", cafile)
        assert status == 200
        return metric_sum(body.decode(), name)


def release_values(port: int) -> dict[str, Any]:
    # The chart-made certificate, which the webhook process here serves, whether or not an earlier
    # test has installed cert-manager's CRDs (webhook.tls.source auto would then pick cert-manager).
    return {"webhook": {"externalURL": f"https://127.0.0.1:{port}", "tls": {"source": "generated"}}}


@pytest.fixture(scope="session")
def release(cluster: controlplane.ControlPlane, core: kubernetes.client.CoreV1Api) -> Iterator[Release]:
    """The chart installed once for the session (release gpuslice-e2e), its webhook and a controller running."""
    port = k8skit.free_port()
    directory = cluster.workdir / "release"
    directory.mkdir(exist_ok=True)
    installed = Release(cluster, core, "e2e", "gpuslice-e2e", port, release_values(port), directory)
    k8skit.install_chart(cluster.admin_kubeconfig, installed.name, installed.namespace, installed.values, directory)
    installed.start_webhook()
    installed.start_controller()
    try:
        yield installed
    finally:
        installed.stop_webhook()
        for controller in list(installed.controllers):
            installed.stop_controller(controller)
        k8skit.helm(
            cluster.admin_kubeconfig, "uninstall", installed.name, "--namespace", installed.namespace, check=False
        )


@pytest.fixture
def nodes(core: kubernetes.client.CoreV1Api) -> Iterator[list[str]]:
    """Names of Nodes a test creates (append them); deleted when it ends, so no test schedules onto
    another's nodes."""
    created: list[str] = []
    yield created
    for name in created:
        try:
            core.delete_node(name)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise


@pytest.fixture
def gpu_nodes(core: kubernetes.client.CoreV1Api, nodes: list[str], namespace: str) -> list[str]:
    """Two simulated GPU nodes (2 x H100 + an A100 in MIG mode each), labelled as our plugin labels them."""
    node = nodefile.load(k8skit.EXAMPLES / "demo-node.yaml")
    names = [f"{namespace}-gpu-{i}" for i in range(2)]
    for name in names:
        core.create_node(k8skit.gpu_node_object(name, node))
        nodes.append(name)
    return names
