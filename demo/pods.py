"""The pods `make demo` sends through the webhook: pods in the shape KAI Scheduler's documentation
gives its GPU-sharing examples (the share is an annotation and nothing else: no GPU resource, KAI's
queue label and `schedulerName: kai-scheduler`), one with the `nvidia.com/gpu: 1` placeholder some
manifests still carry beside a share (KAI's own validator refuses it; gpuslice accepts and removes
it), plus a few of ours covering gpu-fraction, gpu-memory, MIG isolation, one bad annotation and a
pod that asks for no GPU at all. Users must not have to edit any of them.

Pure data; may import only yaml and gpuslice.contract.
"""

from __future__ import annotations

from typing import Any

import yaml

from gpuslice import contract as contract_

__all__ = ["KAI_EXAMPLE_MANIFEST", "KAI_PLACEHOLDER_MANIFEST", "demo_pods"]

# Pods as KAI Scheduler's GPU-sharing documentation shapes them (written here, not copied): a share of
# one GPU asked for by annotation alone, the pod in a KAI queue and addressed to kai-scheduler (which
# the webhook rewrites to a scheduler that exists), a toleration of the GPU nodes' taint.
KAI_EXAMPLE_MANIFEST = """\
apiVersion: v1
kind: Pod
metadata:
  name: gpu-sharing-fraction
  labels:
    kai.scheduler/queue: team-a
  annotations:
    gpu-fraction: "0.5"              # half of one GPU's memory
spec:
  schedulerName: kai-scheduler
  tolerations:
    - key: nvidia.com/gpu
      operator: Exists
      effect: NoSchedule
  containers:
    - name: trainer
      image: ubuntu:24.04
      command: ["sleep", "infinity"]
---
apiVersion: v1
kind: Pod
metadata:
  name: gpu-sharing-memory
  labels:
    kai.scheduler/queue: team-a
  annotations:
    gpu-memory: "2000"               # MiB of one GPU
spec:
  schedulerName: kai-scheduler
  tolerations:
    - key: nvidia.com/gpu
      operator: Exists
      effect: NoSchedule
  containers:
    - name: server
      image: ubuntu:24.04
      command: ["sleep", "infinity"]
---
apiVersion: v1
kind: Pod
metadata:
  name: gpu-pod
  namespace: gpu-workload
  labels:
    kai.scheduler/queue: team-b
  annotations:
    gpu-memory: "2000"
spec:
  schedulerName: kai-scheduler
  restartPolicy: Never
  containers:
    - name: vector-add
      image: nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0
"""

# The placeholder form: a share and, beside it, `nvidia.com/gpu: 1` "for scheduling". KAI refuses
# this pod; gpuslice accepts it and removes the placeholder (a share and whole GPUs cannot combine,
# so any other count is denied).
KAI_PLACEHOLDER_MANIFEST = """\
apiVersion: v1
kind: Pod
metadata:
  name: gpu-placeholder
  annotations:
    gpu-memory: "2000"
spec:
  containers:
    - name: app
      image: ubuntu:24.04
      command: ["sleep", "infinity"]
      resources:
        limits:
          nvidia.com/gpu: 1
"""


def _pod(name: str, annotations: dict[str, str], *, cpu: str = "2", memory: str = "8Gi") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                    "resources": {"requests": {"cpu": cpu, "memory": memory}},
                }
            ]
        },
    }


def demo_pods(contract: contract_.Contract) -> list[dict[str, Any]]:
    """The demo's pods, in the order they are created."""
    pods = [p for p in yaml.safe_load_all(KAI_EXAMPLE_MANIFEST + "---\n" + KAI_PLACEHOLDER_MANIFEST) if p]
    for pod in pods:
        pod["metadata"].setdefault("namespace", "default")
    pods += [
        _pod("notebook", {contract_.KAI_GPU_FRACTION: "0.25"}),
        _pod("llm-inference", {contract_.KAI_GPU_MEMORY: "20Gi"}, cpu="4", memory="32Gi"),
        _pod("isolated-tenant", {contract_.KAI_GPU_MEMORY: "8000", contract.isolation_annotation: "mig"}),
        _pod("typo", {contract_.KAI_GPU_FRACTION: "1.5"}),
        _pod("etl-batch", {}, cpu="4", memory="16Gi"),  # no GPU: steered off nodes with whole GPUs free
    ]
    return pods
