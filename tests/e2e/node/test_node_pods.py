"""The real node itself: a pod from a locally made image runs on containerd through the whole kubelet,
its log and an exec go API server -> kubelet -> containerd, and the node reports what it is."""

from __future__ import annotations

import k8skit
import kubernetes
import realnode
from kubernetes.stream import stream


def busybox_pod(name: str, command: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "localhost/busybox:1",
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", command],
                }
            ],
        },
    }


def running(core: kubernetes.client.CoreV1Api, namespace: str, name: str, timeout: float = 60) -> object:
    def probe() -> object:
        pod = core.read_namespaced_pod(name, namespace)
        statuses = pod.status.container_statuses or []
        return pod if pod.status.phase == "Running" and statuses and all(s.ready for s in statuses) else None

    return k8skit.wait_for(f"{namespace}/{name} Running", probe, timeout)


def test_the_node_registers_itself_with_loopback_as_its_only_address(node_core, real_node):
    node = node_core.read_node(realnode.NODE_NAME)
    assert [a.address for a in node.status.addresses] == ["127.0.0.1", "127.0.0.1"]
    assert node.status.node_info.kubelet_version == real_node.parts.k8s.version
    assert node.status.node_info.container_runtime_version.startswith("containerd://2.")


def test_a_pod_runs_and_its_log_and_an_exec_pass_through_kubelet(node_core, node_namespace):
    node_core.create_namespaced_pod(node_namespace, busybox_pod("hello", "echo hello from the node; sleep 3600"))
    pod = running(node_core, node_namespace, "hello")
    assert pod.spec.node_name == realnode.NODE_NAME
    assert pod.status.pod_ip.startswith("10.88.0.")
    log = k8skit.wait_for("the log", lambda: node_core.read_namespaced_pod_log("hello", node_namespace), 30)
    assert "hello from the node" in log
    out = stream(
        node_core.connect_get_namespaced_pod_exec,
        "hello",
        node_namespace,
        command=["cat", "/etc/passwd"],
        stderr=True,
        stdout=True,
        stdin=False,
        tty=False,
    )
    assert out.startswith("root:x:0:0"), out
