"""Fixtures of the tests on a real node (tests/e2e/node): containerd and a whole kubelet joined to the
real control plane on this machine (realnode.py), started once for these tests and taken down after
them, leaving the machine as it was. One node per machine: kubelet's device-plugin directory is fixed.

Needs root, the Kubernetes build with its kubelet ($GPUSLICE_K8S_BIN), containerd and the node images
($GPUSLICE_NODE_DIR, e2e/node/build.sh), the gpuslice image ($GPUSLICE_IMAGE_TAR, e2e/image/build.sh)
and Debian's runc, CNI plugins and iptables (e2e/node/install-packages.sh); `make test` provides them
all. Without one of them these tests are left out with one line, or fail where CI requires them
(GPUSLICE_REQUIRE_E2E=1).
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator
from typing import Any

import k8skit
import kubernetes
import pytest
import realnode

HERE = pathlib.Path(__file__).resolve().parent
_LEFT_OUT: list[str] = []


def _image_tars() -> tuple[str, ...]:
    tar = os.environ.get(realnode.IMAGE_ENV)
    return (tar,) if tar else ()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(k8skit.REQUIRE_ENV) == "1":
        return  # the fixture fails, naming what is missing
    mine = [item for item in items if HERE in item.path.parents]
    if not mine:
        return
    try:
        realnode.find_parts(_image_tars())
        if not _image_tars():
            raise realnode.NodeUnavailable(f"the gpuslice image is not built (${realnode.IMAGE_ENV}; `make node`)")
    except realnode.NodeUnavailable as exc:
        _LEFT_OUT[:] = [f"{len(mine)} tests on a real node (tests/e2e/node): {exc}"]
        items[:] = [item for item in items if HERE not in item.path.parents]
        config.hook.pytest_deselected(items=mine)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in _LEFT_OUT:
        terminalreporter.write_line(f"SKIPPED {line}", yellow=True)


@pytest.fixture(scope="session")
def real_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[realnode.RealNode]:
    """The node, Ready, for every test here; its teardown is checked to leave nothing behind."""
    try:
        parts = realnode.find_parts(_image_tars())
        if not parts.images:
            raise realnode.NodeUnavailable(f"the gpuslice image is not built (${realnode.IMAGE_ENV}; `make node`)")
    except realnode.NodeUnavailable as exc:
        pytest.fail(f"{k8skit.REQUIRE_ENV}=1 but the real node cannot run: {exc}", pytrace=False)
    node = realnode.RealNode(parts, tmp_path_factory.mktemp("node"))
    try:
        node.start()
    except (realnode.NodeUnavailable, AssertionError) as exc:
        pytest.fail(f"the real node did not start: {exc}", pytrace=False)
    try:
        yield node
    finally:
        dials = node.foreign_dials()
        node.stop()
        left = realnode.leftovers(parts.node_dir)
    assert not dials, "a component dialled outside loopback and the pod CIDR:\n" + "\n".join(dials)
    assert not left, "the node's teardown left: " + "; ".join(left)


@pytest.fixture(scope="session")
def node_api(real_node: realnode.RealNode) -> kubernetes.client.ApiClient:
    return k8skit.api_client(real_node.plane.admin_kubeconfig)


@pytest.fixture(scope="session")
def node_core(node_api: kubernetes.client.ApiClient) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(node_api)


@pytest.fixture
def node_namespace(node_core: kubernetes.client.CoreV1Api, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace; deleted afterwards, its pods waited for, so the next test finds the node idle."""
    prefix = request.node.name.split("[")[0].replace("_", "-")[:40].strip("-")
    name = k8skit.create_namespace(node_core, prefix or "node")
    k8skit.wait_for(
        f"the default ServiceAccount of {name}", lambda: node_core.list_namespaced_service_account(name).items, 30
    )
    yield name
    node_core.delete_namespace(name)
    k8skit.wait_for(
        f"the pods of {name} gone",
        lambda: not node_core.list_namespaced_pod(name).items,
        timeout=120,
    )


@pytest.fixture(scope="session")
def mock_driver(real_node: realnode.RealNode, node_api: kubernetes.client.ApiClient) -> Iterator[realnode.MockDriver]:
    """The node's NVIDIA driver as the GPU Operator leaves a node: a driver root whose NVML is built
    on go-nvml's mock DGX A100, its CDI specification in /etc/cdi (`publish_cdi_spec`, once a test
    module has set the MIG layout) and the `nvidia` RuntimeClass for containerd's nvidia handler."""
    assert real_node.parts.nvml_dir is not None
    driver = realnode.MockDriver(real_node.workdir / "driver", real_node.parts.nvml_dir)
    node = kubernetes.client.NodeV1Api(node_api)
    node.create_runtime_class(
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"}
    )
    try:
        yield driver
    finally:
        driver.withdraw_cdi_spec()
        node.delete_runtime_class("nvidia")


@pytest.fixture(scope="session")
def image(real_node: realnode.RealNode) -> dict[str, str]:
    """The chart's `image` values for the gpuslice image built from this checkout (never pulled)."""
    repository, tag = realnode.image_reference(real_node.parts.images[0])
    return {"repository": repository, "tag": tag, "pullPolicy": "Never"}
