"""Helpers for the requeuer's tests (controller/requeue.py, controller/requeue_journal.py): a pod
kubelet refused, kube-apiserver's side of the calls the requeuer makes (in memory), a requeuer
over it, and the name of the journal entry of the refused pod."""

from __future__ import annotations

import copy
import dataclasses
import datetime
from typing import Any

import kubernetes
import prometheus_client

from gpuslice import config
from gpuslice.controller import requeue

CONTRACT = config.Config().contract


def refused_pod(**metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "train",
            "namespace": "team-a",
            "uid": "6f1c2b7e-0000-4000-8000-000000000001",
            "resourceVersion": "4711",
            "creationTimestamp": "2026-11-23T19:00:00Z",
            "labels": {"app": "train"},
            "annotations": {"gpu-fraction": "0.6", CONTRACT.decision_annotation: "{}"},
            "managedFields": [{"manager": "kubectl"}],
            **metadata,
        },
        "spec": {
            "nodeName": "gpu-7",
            "schedulerName": "default-scheduler",
            "containers": [
                {"name": "main", "image": "train:1", "resources": {"limits": {"gpuslice.io/gpu-memory": "191"}}}
            ],
        },
        "status": {
            "phase": "Failed",
            "reason": "UnexpectedAdmissionError",
            "message": "no single GPU had 191 units",
        },
    }


class _Api:
    """kube-apiserver's side of what the requeuer calls, in memory: pods and ConfigMaps by name
    (a create of a taken name is 409, a delete of a missing one 404, a delete whose UID
    precondition fails 409), every call recorded in order. Against the real API server:
    tests/e2e/test_real_burst.py."""

    def __init__(self, pods: list[dict[str, Any]] = ()) -> None:  # type: ignore[assignment]
        self.pods: dict[tuple[str, str], Any] = {}
        for pod in pods:
            self._put_pod(pod["metadata"]["namespace"], pod)
        self.config_maps: dict[tuple[str, str], Any] = {}
        self.calls: list[str] = []
        self.created: list[dict[str, Any]] = []
        self.refuse_creates: int | None = None  # an HTTP status every pod create answers
        self.events: list[Any] = []

    def _put_pod(self, namespace: str, body: dict[str, Any]) -> Any:
        metadata = body["metadata"]
        uid = metadata.get("uid") or f"uid-{len(self.calls)}"
        self.pods[(namespace, metadata["name"])] = kubernetes.client.V1Pod(
            metadata=kubernetes.client.V1ObjectMeta(
                name=metadata["name"],
                namespace=namespace,
                uid=uid,
                deletion_timestamp=metadata.get("deletionTimestamp"),
            )
        )
        return self.pods[(namespace, metadata["name"])]

    def delete_namespaced_pod(self, name: str, namespace: str, body: Any) -> None:
        self.calls.append(f"delete pod {name}")
        pod = self.pods.get((namespace, name))
        if pod is None:
            raise kubernetes.client.ApiException(status=404)
        if body.preconditions.uid != pod.metadata.uid:
            raise kubernetes.client.ApiException(status=409)
        del self.pods[(namespace, name)]

    def create_namespaced_pod(self, namespace: str, body: dict[str, Any]) -> Any:
        self.calls.append(f"create pod {body['metadata']['name']}")
        if self.refuse_creates is not None:
            raise kubernetes.client.ApiException(status=self.refuse_creates)
        if (namespace, body["metadata"]["name"]) in self.pods:
            raise kubernetes.client.ApiException(status=409)
        self.created.append(body)
        return self._put_pod(namespace, copy.deepcopy(body))

    def read_namespaced_pod(self, name: str, namespace: str) -> Any:
        pod = self.pods.get((namespace, name))
        if pod is None:
            raise kubernetes.client.ApiException(status=404)
        return pod

    def create_namespaced_event(self, namespace: str, body: Any) -> None:
        self.events.append(body)

    def create_namespaced_config_map(self, namespace: str, body: Any) -> None:
        self.calls.append(f"create configmap {body.metadata.name}")
        key = (namespace, body.metadata.name)
        if key in self.config_maps:
            raise kubernetes.client.ApiException(status=409)
        body.metadata.creation_timestamp = datetime.datetime.now(datetime.UTC)
        self.config_maps[key] = body

    def delete_namespaced_config_map(self, name: str, namespace: str) -> None:
        self.calls.append(f"delete configmap {name}")
        if self.config_maps.pop((namespace, name), None) is None:
            raise kubernetes.client.ApiException(status=404)

    def list_namespaced_config_map(self, namespace: str, label_selector: str) -> Any:
        items = [
            c for (ns, _), c in self.config_maps.items() if ns == namespace and label_selector in c.metadata.labels
        ]
        return kubernetes.client.V1ConfigMapList(items=items)


def _requeuer(api: _Api, **options: Any) -> requeue.Requeuer:
    settings = config.Config()
    settings = dataclasses.replace(settings, requeue=dataclasses.replace(settings.requeue, backoff_seconds=0.0))
    return requeue.Requeuer(
        api,  # type: ignore[arg-type]
        settings,
        registry=prometheus_client.CollectorRegistry(),
        namespace="gpuslice-system",
        **options,
    )


ENTRY = f"gpuslice-requeue-{refused_pod()['metadata']['uid']}"
