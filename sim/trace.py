"""The Alibaba cluster-trace-gpu-v2023 ("openb") CSV files, and what they become in gpuslice terms:
simulated nodes (a NodeInventory per trace node) and pods written as a user would write them
(KAI annotations, whole `nvidia.com/gpu`, a GPU-model affinity for gpu_spec).

Reads only; the trace itself is never copied into the repository (research-use licence). May import
gpuslice.contract and gpuslice.node.inventory; no other gpuslice module.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import pathlib
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from gpuslice import contract as contract_
from gpuslice.node import inventory

__all__ = [
    "DEFAULT_NODE_FILE",
    "DEFAULT_POD_FILE",
    "DEFAULT_TRACE_DIR",
    "GPU_MEMORY_MIB",
    "HOW_TO_GET_IT",
    "TraceError",
    "TraceNode",
    "TracePod",
    "find_trace_dir",
    "load_nodes",
    "load_pods",
    "node_inventory",
    "trace_files",
    "user_pod",
]

DEFAULT_NODE_FILE = "openb_node_list_gpu_node.csv"
DEFAULT_POD_FILE = "openb_pod_list_default.csv"
# Where the trace is looked for last: beside the checkout, as CI and developers have it.
DEFAULT_TRACE_DIR = pathlib.PurePath("..", "shared", "data", "alibaba-gpu-2023")

# Said with every missing trace file: where the trace comes from and how to lay it out
# (docs/simulator.md, "Reproducing the headline").
HOW_TO_GET_IT = (
    "  Get it: https://github.com/alibaba/clusterdata, folder cluster-trace-gpu-v2023/csv (Alibaba's GPU cluster "
    "trace, the FGD paper's openb lists; research use only, gpuslice never ships it).\n"
    f"  Lay it out: its csv files ({DEFAULT_NODE_FILE}, openb_pod_list_*.csv) in one folder, passed as "
    f"--trace-dir DIR or GPUSLICE_TRACE_DIR, or at {DEFAULT_TRACE_DIR} from the checkout's root "
    '(docs/simulator.md, "Reproducing the headline").'
)

# MiB of memory per GPU model, as NVML reports it on the disclosed models (a T4 shows 15360 MiB).
# G1/G2/G3 are undisclosed in the trace and the FGD paper; we assume 32 GiB (docs/simulator.md says
# why: the value only sets how finely a gpu_milli share rounds up to 256 MiB units).
GPU_MEMORY_MIB: Mapping[str, int] = {
    "T4": 15360,
    "P100": 16384,
    "V100M16": 16384,
    "V100M32": 32768,
    "A10": 24576,
    "G1": 32768,
    "G2": 32768,
    "G3": 32768,
}

_NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
_POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


class TraceError(ValueError):
    """A trace file is missing, unreadable or not in the cluster-trace-gpu-v2023 format."""


@dataclasses.dataclass(frozen=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str  # "" for a CPU-only node


@dataclasses.dataclass(frozen=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # share of one GPU (sharing pods) or 1000 (whole GPUs)
    gpu_spec: tuple[str, ...] = ()  # allowed GPU models, empty = any

    @property
    def gpu_demand_milli(self) -> int:
        """GPU milli the pod asks for: what the allocation ratio counts."""
        return self.num_gpu * self.gpu_milli

    @property
    def is_sharing(self) -> bool:
        return self.num_gpu == 1 and 0 < self.gpu_milli < 1000


def find_trace_dir(
    given: str | os.PathLike[str] | None, environ: Mapping[str, str], repo: pathlib.Path
) -> pathlib.Path:
    """--trace-dir, else $GPUSLICE_TRACE_DIR, else ../shared/data/alibaba-gpu-2023 beside the repository."""
    default = repo.parent.joinpath(*DEFAULT_TRACE_DIR.parts[1:])
    if given:
        source, path = "from --trace-dir", pathlib.Path(given)
    elif environ.get("GPUSLICE_TRACE_DIR"):
        source, path = "from GPUSLICE_TRACE_DIR", pathlib.Path(environ["GPUSLICE_TRACE_DIR"])
    else:
        source, path = "the default: neither --trace-dir nor GPUSLICE_TRACE_DIR is set", default
    if not (path / DEFAULT_NODE_FILE).is_file():
        where = f"{DEFAULT_NODE_FILE} is not in it" if path.is_dir() else "no such folder"
        raise TraceError(f"no Alibaba GPU trace at {path} ({source}): {where}.\n{HOW_TO_GET_IT}")
    return path


def trace_files(
    nodes: str | None, pods: str | None, trace_dir: str | None, environ: Mapping[str, str], repo: pathlib.Path
) -> tuple[pathlib.Path, pathlib.Path]:
    """(node file, pod file): --nodes and --pods as given, the trace directory's defaults for the
    one not given (the directory is looked for only then)."""
    if nodes and pods:
        return pathlib.Path(nodes), pathlib.Path(pods)
    found = find_trace_dir(trace_dir, environ, repo)
    return (
        pathlib.Path(nodes) if nodes else found / DEFAULT_NODE_FILE,
        pathlib.Path(pods) if pods else found / DEFAULT_POD_FILE,
    )


def _rows(path: pathlib.Path, required: Sequence[str]) -> list[dict[str, str]]:
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in required if c not in (reader.fieldnames or ())]
            if missing:
                raise TraceError(f"{path}: missing column(s) {', '.join(missing)}; expected {', '.join(required)}")
            return list(reader)
    except FileNotFoundError:
        raise TraceError(f"trace file {path} is not there.\n{HOW_TO_GET_IT}") from None
    except OSError as exc:
        raise TraceError(f"cannot read trace file {path}: {exc.strerror}") from None


def _int(row: Mapping[str, str], column: str, path: pathlib.Path, line: int) -> int:
    text = (row.get(column) or "").strip()
    try:
        value = int(text)
    except ValueError:
        raise TraceError(f"{path}:{line}: {column} must be an integer, got {text!r}") from None
    if value < 0:
        raise TraceError(f"{path}:{line}: {column} must not be negative, got {value}")
    return value


def load_nodes(path: str | os.PathLike[str]) -> list[TraceNode]:
    path = pathlib.Path(path)
    nodes = []
    for line, row in enumerate(_rows(path, _NODE_COLUMNS), start=2):
        gpus = _int(row, "gpu", path, line)
        model = (row.get("model") or "").strip()
        if gpus and model not in GPU_MEMORY_MIB:
            raise TraceError(
                f"{path}:{line}: GPU model {model!r} has no assumed memory; known: {', '.join(GPU_MEMORY_MIB)}"
            )
        nodes.append(
            TraceNode(
                name=row["sn"].strip(),
                cpu_milli=_int(row, "cpu_milli", path, line),
                memory_mib=_int(row, "memory_mib", path, line),
                gpus=gpus,
                model=model,
            )
        )
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    return nodes


def load_pods(path: str | os.PathLike[str]) -> list[TracePod]:
    path = pathlib.Path(path)
    pods = []
    for line, row in enumerate(_rows(path, _POD_COLUMNS), start=2):
        num_gpu = _int(row, "num_gpu", path, line)
        gpu_milli = _int(row, "gpu_milli", path, line)
        if gpu_milli > 1000:
            raise TraceError(f"{path}:{line}: gpu_milli must be 0..1000, got {gpu_milli}")
        if num_gpu > 1 and gpu_milli != 1000:
            raise TraceError(f"{path}:{line}: a pod with num_gpu {num_gpu} must have gpu_milli 1000, got {gpu_milli}")
        if num_gpu and not gpu_milli:
            raise TraceError(f"{path}:{line}: num_gpu {num_gpu} with gpu_milli 0")
        spec = tuple(dict.fromkeys(s for s in (row.get("gpu_spec") or "").split("|") if s.strip()))
        pods.append(
            TracePod(
                name=row["name"].strip(),
                cpu_milli=_int(row, "cpu_milli", path, line),
                memory_mib=_int(row, "memory_mib", path, line),
                num_gpu=num_gpu,
                gpu_milli=gpu_milli if num_gpu else 0,
                gpu_spec=spec,
            )
        )
    if not pods:
        raise TraceError(f"{path}: no pods")
    return pods


def node_inventory(node: TraceNode, memory_mib: Mapping[str, int] = GPU_MEMORY_MIB) -> inventory.NodeInventory:
    """The node's GPUs as the device plugin would see them; UUIDs are stable per node name and index."""
    gpus = tuple(
        inventory.Gpu(
            uuid="GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node.name}.{i}.gpuslice.sim")),
            model=node.model,
            memory_mib=memory_mib[node.model],
            index=i,
            minor_number=i,
        )
        for i in range(node.gpus)
    )
    return inventory.NodeInventory(gpus=gpus, source=f"trace node {node.name}")


def user_pod(
    pod: TracePod, contract: contract_.Contract, *, namespace: str = "default", whole_gpus_only: bool = False
) -> dict[str, Any]:
    """The pod a user would write for this trace pod, before any webhook.

    Sharing pods carry the KAI annotation gpu-fraction; whole-GPU pods ask for `nvidia.com/gpu: N`
    (converted by the webhook when convertWholeGpus is on); gpu_spec becomes a required node affinity
    on the GPU product label, whose value on trace nodes is the trace's model name. A zero cpu or
    memory in the trace is left unset (the scheduler then scores it as kube's non-zero default).
    `whole_gpus_only`: stock Kubernetes without sharing, a sharing pod takes `nvidia.com/gpu: 1`.
    """
    requests: dict[str, Any] = {}
    if pod.cpu_milli:
        requests["cpu"] = f"{pod.cpu_milli}m"
    if pod.memory_mib:
        requests["memory"] = f"{pod.memory_mib}Mi"
    limits: dict[str, Any] = {}
    annotations: dict[str, str] = {}
    if pod.is_sharing and not whole_gpus_only:
        annotations[contract_.KAI_GPU_FRACTION] = _fraction_text(pod.gpu_milli)
    elif pod.num_gpu:
        limits[contract_.NVIDIA_GPU] = str(pod.num_gpu)
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    container: dict[str, Any] = {"name": "main", "image": "trace", "resources": resources}
    spec: dict[str, Any] = {"containers": [container]}
    if pod.gpu_spec and pod.num_gpu:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": contract.label_gpu_product, "operator": "In", "values": list(pod.gpu_spec)}
                            ]
                        }
                    ]
                }
            }
        }
    metadata: dict[str, Any] = {"name": pod.name, "namespace": namespace}
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _fraction_text(milli: int) -> str:
    return f"{milli / 1000:.3f}".rstrip("0").rstrip(".")
