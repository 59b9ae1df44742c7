"""What the tests of the webhook's cluster view and its parts (webhook/cluster.py, nodetable.py)
share: an empty view, and a node's GPU labels as the device plugin writes them."""

from __future__ import annotations

from gpuslice import config
from gpuslice.webhook import cluster

CONTRACT = config.Config().contract


def view() -> cluster.ClusterView:
    return cluster.ClusterView(CONTRACT, default_gpu_memory_mib=81920)


def gpu_labels(memory_mib: int, gpus: int, product: str = "GPU", free_units: int | None = None) -> dict[str, str]:
    labels = {
        "kubernetes.io/hostname": "x",
        CONTRACT.label_gpu_product: product,
        CONTRACT.label_gpu_memory_mib: str(memory_mib),
        CONTRACT.label_gpu_count: str(gpus),
    }
    if free_units is not None:
        labels[CONTRACT.label_free_units] = str(free_units)
    return labels
