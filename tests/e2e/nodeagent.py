"""The pod side of a kubelet for one node, for tests on the real control plane: there is no real
kubelet here (no container runtime), so this plays the part kubelet plays between binding and
running, and nothing else.

For each pod the real kube-scheduler binds to the node it asks kubelet's real device manager
(dmharness, the same code kubelet runs in its admission handler) to admit the pod: on success the
pod's status becomes Running, as kubelet's status manager would write it; on refusal it becomes
Failed with reason UnexpectedAdmissionError and the device manager's message, exactly what kubelet
writes when a device plugin refuses (the pod is then terminal: only a controller makes a new one).
A deleted pod is released from the device manager, as kubelet does once its containers are gone.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any

import k8skit
import kubernetes

from gpuslice import contract as contract_

log = logging.getLogger(__name__)

REFUSED_REASON = contract_.KUBELET_REFUSED_REASON


@dataclasses.dataclass
class Decision:
    namespace: str
    name: str
    admitted: bool
    message: str
    devices: dict[str, list[str]]  # resource -> device IDs (admitted pods)
    released: bool = False  # the pod was deleted and its devices given back


class NodeAgent:
    """Admits the pods bound to `node` through `harness`, in a thread, until `stop()`."""

    def __init__(self, core: kubernetes.client.CoreV1Api, node: str, harness: k8skit.Harness) -> None:
        self.core = core
        self.node = node
        self.harness = harness
        # pod UID -> what kubelet decided (kept after deletion); written by the agent's thread while the
        # test reads it, so read through decided(), a copy taken under the lock
        self._decisions: dict[str, Decision] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"node-agent-{node}", daemon=True)
        self.errors: list[str] = []

    def start(self) -> NodeAgent:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def _run(self) -> None:
        serializer = kubernetes.client.ApiClient()
        selector = f"spec.nodeName={self.node}"
        version = ""
        while not self._stop.is_set():
            try:
                if not version:  # list first, so a pod bound before the watch started is seen
                    listed = self.core.list_pod_for_all_namespaces(field_selector=selector)
                    version = listed.metadata.resource_version
                    for pod in listed.items:
                        self._on_pod("ADDED", serializer.sanitize_for_serialization(pod))
                stream = kubernetes.watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces,
                    field_selector=selector,
                    resource_version=version,
                    timeout_seconds=2,
                    _preload_content=False,
                )
                for event in stream:
                    raw = event["raw_object"]
                    version = raw["metadata"]["resourceVersion"]
                    self._on_pod(event["type"], raw)
                    if self._stop.is_set():
                        break
            except kubernetes.client.ApiException as exc:
                if exc.status == 410:  # resource version too old: list again
                    version = ""
                    continue
                self.errors.append(f"{exc.status}: {exc.reason}")
                time.sleep(0.2)
            except Exception as exc:  # noqa: BLE001 - recorded and asserted on by the tests
                self.errors.append(repr(exc))
                time.sleep(0.2)

    def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        if kind == "DELETED":
            with self._lock:
                decision = self._decisions.get(uid)
            if decision is not None and decision.admitted and not decision.released:
                self.harness.remove(uid)
                decision.released = True
            return
        with self._lock:
            decided = uid in self._decisions
        if decided or (pod.get("status") or {}).get("phase") not in (None, "Pending"):
            return
        status, body = self.harness.admit(pod)
        meta = pod["metadata"]
        if status == 200:
            devices = {
                resource: list(ids)
                for container in (body.get("containers") or {}).values()
                for resource, ids in (container.get("devices") or {}).items()
            }
            decision = Decision(meta["namespace"], meta["name"], True, "", devices)
            patch = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
        else:
            message = str(body.get("error") if isinstance(body, dict) else body)
            decision = Decision(meta["namespace"], meta["name"], False, message, {})
            patch = {"status": {"phase": "Failed", "reason": REFUSED_REASON, "message": message}}
        with self._lock:
            self._decisions[uid] = decision
        try:
            self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], patch)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:  # deleted meanwhile: nothing to report
                raise

    def decided(self) -> list[Decision]:
        """What kubelet decided so far, in order: a copy the agent's thread cannot change under the caller."""
        with self._lock:
            return list(self._decisions.values())

    def refusals(self) -> list[Decision]:
        return [d for d in self.decided() if not d.admitted]
