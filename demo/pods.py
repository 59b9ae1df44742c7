"""The pods `make demo` sends through the webhook: KAI Scheduler's own example manifests, taken
unchanged (users must not have to edit them), plus a few of ours covering gpu-fraction,
gpu-memory, MIG isolation, one bad annotation and a pod that asks for no GPU at all.

Pure data; may import only yaml and gpuslice.contract.
"""

from __future__ import annotations

from typing import Any

import yaml

from gpuslice import contract as contract_

__all__ = ["KAI_EXAMPLE_MANIFEST", "demo_pods"]

# KAI Scheduler's example pods as its documentation shows them (public, a few lines): note the
# nvidia.com/gpu: 1 placeholder and the third pod's kai-scheduler schedulerName and queue label.
KAI_EXAMPLE_MANIFEST = """\
apiVersion: v1
kind: Pod
metadata:
  name: gpu-sharing-fraction
  annotations:
    gpu-fraction: "0.5"
spec:
  containers:
  - name: my-container
    image: your-image
    resources:
      limits:
        nvidia.com/gpu: 1
---
apiVersion: v1
kind: Pod
metadata:
  name: gpu-sharing-memory
  annotations:
    gpu-memory: "2000"
spec:
  containers:
  - name: my-container
    image: your-image
    resources:
      limits:
        nvidia.com/gpu: 1
---
apiVersion: v1
kind: Pod
metadata:
  name: gpu-pod
  namespace: gpu-workload
  labels:
    kai.scheduler/queue: test
  annotations:
    # choose only one of the two options below:
    #gpu-fraction: "0.2"     # 20% of GPU compute
    gpu-memory: "2000"       # 2000 MiB of GPU memory
spec:
  schedulerName: kai-scheduler
  restartPolicy: Never
  containers:
    - name: cuda-container
      image: nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0
  tolerations:
    - key: nvidia.com/gpu
      operator: Exists
      effect: NoSchedule
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
    pods = [p for p in yaml.safe_load_all(KAI_EXAMPLE_MANIFEST) if p]
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
