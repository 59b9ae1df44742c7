"""The resource contract between the webhook, the device plugin, the chart and the simulator.

Everything another component or a user can see lives here and only here: resource names,
unit size, device IDs, node label keys, annotation names and the environment a container gets.
Both halves import this module; nothing in it does I/O or imports other gpuslice modules.

A `Contract` is built once from the configured resource prefix and unit size, then passed down.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import NamedTuple

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_UNIT_MIB",
    "Contract",
    "KAI_GPU_FRACTION",
    "KAI_GPU_MEMORY",
    "KAI_GPU_FRACTION_NUM_DEVICES",
    "KAI_GPU_FRACTION_CONTAINER_NAME",
    "KAI_ANNOTATIONS",
    "GPU_CLASS_ANY",
    "KUBELET_REFUSED_REASON",
    "NVIDIA_GPU",
    "NVIDIA_GPU_PRODUCT_LABEL",
    "UnitDeviceId",
    "unit_device_id",
    "parse_unit_device_id",
    "unit_gpu_uuid",
    "mig_resource_suffix",
    "label_value",
    "units_for_mib",
]

DEFAULT_PREFIX = "gpuslice.io"
DEFAULT_UNIT_MIB = 256

# Pod annotations users already write for KAI Scheduler (KAI's names, unprefixed).
KAI_GPU_FRACTION = "gpu-fraction"
KAI_GPU_MEMORY = "gpu-memory"
KAI_GPU_FRACTION_NUM_DEVICES = "gpu-fraction-num-devices"
KAI_GPU_FRACTION_CONTAINER_NAME = "gpu-fraction-container-name"
GPU_CLASS_ANY = "any"  # the value of Contract.gpu_class_annotation that opts out of one class per owner
KAI_ANNOTATIONS = (
    KAI_GPU_FRACTION,
    KAI_GPU_MEMORY,
    KAI_GPU_FRACTION_NUM_DEVICES,
    KAI_GPU_FRACTION_CONTAINER_NAME,
)

# The status reason kubelet writes on a pod its admission refuses (a device plugin's Allocate
# error among them): the pod is Failed for good; the webhook's requeuer looks for it.
KUBELET_REFUSED_REASON = "UnexpectedAdmissionError"

# NVIDIA's whole-GPU resource: a placeholder in KAI manifests, converted when convertWholeGpus is on.
NVIDIA_GPU = "nvidia.com/gpu"
# NVIDIA GPU feature discovery's product label: pods that select a product with it keep that choice
# (the webhook reads it like our gpu.product label, whose values have the same form).
NVIDIA_GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"

# Container environment set by Allocate.
ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
ENV_MEMORY_LIMIT_MIB = "GPUSLICE_MEMORY_LIMIT_MIB"
ENV_GPU_FRACTION = "GPUSLICE_GPU_FRACTION"
ENV_GPU_COUNT = "GPUSLICE_GPU_COUNT"
ENV_KAI_GPU_PORTION = "GPU_PORTION"
ENV_MPS_PINNED_MEM_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ENV_MPS_THREAD_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
ENV_MPS_PIPE_DIRECTORY = "CUDA_MPS_PIPE_DIRECTORY"

# --- DRA mode (docs/dra.md) ------------------------------------------------------------------
# Device attributes and capacity of the ResourceSlices the DRA plugin publishes. Unqualified
# names belong to the driver's domain: a CEL selector reads them as
# device.attributes["<driver>"].memoryMiB and device.capacity["<driver>"].memory.
DRA_ATTR_TYPE = "type"  # "gpu" (shared by memory) or "mig"
DRA_TYPE_GPU = "gpu"
DRA_TYPE_MIG = "mig"
DRA_ATTR_UUID = "uuid"
DRA_ATTR_PRODUCT = "product"  # label form, as the gpu.product node label: "NVIDIA-H100-80GB-HBM3"
DRA_ATTR_PRODUCT_NAME = "productName"  # as NVML reports it
DRA_ATTR_MEMORY_MIB = "memoryMiB"  # the whole GPU's (or MIG device's) memory, as gpu.memory-mib
DRA_ATTR_INDEX = "index"
DRA_ATTR_MINOR = "minor"
DRA_ATTR_PCI_BUS_ID = "pciBusID"
DRA_ATTR_NUMA_NODE = "numaNode"
DRA_ATTR_NVLINK_PEERS = "nvlinkPeers"  # GPUs of the node this one reaches over NVLink
DRA_ATTR_NVLINK_DOMAIN = "nvlinkDomain"  # same value on GPUs connected by NVLink (matchAttribute)
DRA_ATTR_MIG_PROFILE = "migProfile"
DRA_ATTR_PARENT_UUID = "parentUUID"
DRA_ATTR_PARENT_INDEX = "parentIndex"
# A MIG device's memory: informational, the device is taken whole. A GPU shared by memory
# publishes it under the driver's own domain instead (Contract.dra_capacity_memory).
DRA_CAPACITY_MEMORY = "memory"
# Tags of a GPU shared by memory: capacities of 1 that a share consumes none of (request policy
# default 0), so that a whole-GPU request can pick such GPUs, of one memory size or of any, by
# asking a capacity instead of a CEL selector the allocator would evaluate on every device
# (docs/dra.md, "Scheduling cost"). "whole" on every one; "m<memoryMiB>" by memory size.
DRA_TAG_WHOLE = "whole"
DRA_TAG_MEMORY_PREFIX = "m"
DRA_MAX_DRIVER_NAME_LENGTH = 63
# The most devices one ResourceClaim's allocation holds (resource.k8s.io/v1 AllocationResultsMaxSize):
# a claim asking for more can never be allocated.
DRA_MAX_DEVICES_PER_CLAIM = 32

# Memory-unit device IDs are "<GPU UUID>::<unit MiB>Mi::<unit index>": the GPU is readable from
# the ID alone, and the unit size is part of the device's identity. Kubelet's checkpoint keeps the
# IDs of earlier allocations across plugin restarts and counts them as taken by ID: were the size
# not in the ID, a plugin restarted with smaller units would advertise the same IDs again, kubelet
# would call the old holders' 256 MiB units 128 MiB ones, and the GPU would be promised more than
# it has (docs/deviceplugin.md, "Changing the unit size"). A 40-character NVML UUID plus the
# separators, a 5-digit size and a 6-digit index stays below kubelet's 63 characters.
_UNIT_SEPARATOR = "::"
_UNIT_SIZE_SUFFIX = "Mi"
MAX_DEVICE_ID_LENGTH = 63

_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


class UnitDeviceId(NamedTuple):
    """The parts of a memory-unit device ID."""

    gpu_uuid: str
    unit_mib: int
    unit: int  # the unit's number on its GPU (not `index`: that is tuple.index)


def unit_device_id(gpu_uuid: str, index: int, unit_mib: int) -> str:
    """The device ID of memory unit `index` (of `unit_mib` MiB) of GPU `gpu_uuid`."""
    device_id = f"{gpu_uuid}{_UNIT_SEPARATOR}{unit_mib}{_UNIT_SIZE_SUFFIX}{_UNIT_SEPARATOR}{index}"
    if len(device_id) > MAX_DEVICE_ID_LENGTH:
        raise ValueError(
            f"device ID {device_id!r} is {len(device_id)} characters; kubelet allows {MAX_DEVICE_ID_LENGTH}"
        )
    return device_id


def parse_unit_device_id(device_id: str) -> UnitDeviceId:
    """(GPU UUID, unit MiB, unit index) of a memory-unit device ID; ValueError names a malformed
    one (an ID without the unit size, from gpuslice 0.1, is malformed here: see `unit_gpu_uuid`)."""
    rest, sep, index = device_id.rpartition(_UNIT_SEPARATOR)
    gpu_uuid, sep2, size = rest.rpartition(_UNIT_SEPARATOR)
    unit = size.removesuffix(_UNIT_SIZE_SUFFIX)
    if not (sep and sep2 and gpu_uuid and index.isdigit() and size.endswith(_UNIT_SIZE_SUFFIX) and unit.isdigit()):
        raise ValueError(f"{device_id!r} is not a gpuslice memory-unit device ID (<GPU UUID>::<unit MiB>Mi::<unit>)")
    return UnitDeviceId(gpu_uuid, int(unit), int(index))


def unit_gpu_uuid(device_id: str) -> str:
    """The GPU UUID a memory-unit device ID names, in this format or gpuslice 0.1's
    `<GPU UUID>::<unit>` (which did not carry the unit size); "" when it names none."""
    return device_id.partition(_UNIT_SEPARATOR)[0] if _UNIT_SEPARATOR in device_id else ""


def mig_resource_suffix(profile: str) -> str:
    """Resource-name form of a MIG profile ("1g.10gb+me" -> "1g.10gb.me"), as NVIDIA names them."""
    return profile.replace("+", ".")


def label_value(text: str) -> str:
    """A Kubernetes label value from free text ("NVIDIA H100 80GB HBM3" -> "NVIDIA-H100-80GB-HBM3")."""
    value = _LABEL_VALUE_BAD.sub("-", text.strip()).strip("-_.")
    return value[:63].rstrip("-_.")


def units_for_mib(mib: float, unit_mib: int) -> int:
    """Units that hold `mib` MiB: rounded up, so a pod never gets less memory than it asked for."""
    return max(1, math.ceil(mib / unit_mib - 1e-9))


@dataclasses.dataclass(frozen=True)
class Contract:
    """Names derived from the configured resource prefix and unit size (each built once per
    contract: the webhook reads several on every admission)."""

    prefix: str = DEFAULT_PREFIX
    unit_mib: int = DEFAULT_UNIT_MIB

    # --- extended resources -------------------------------------------------------------
    @functools.cached_property
    def gpu_memory_resource(self) -> str:
        return f"{self.prefix}/gpu-memory"

    @functools.cached_property
    def mig_resource_prefix(self) -> str:
        return f"{self.prefix}/mig-"

    def mig_resource(self, profile: str) -> str:
        return f"{self.mig_resource_prefix}{mig_resource_suffix(profile)}"

    def is_gpuslice_resource(self, name: str) -> bool:
        return name == self.gpu_memory_resource or name.startswith(self.mig_resource_prefix)

    def unit_device_id(self, gpu_uuid: str, index: int) -> str:
        """The device ID of memory unit `index` of `gpu_uuid` at this contract's unit size."""
        return unit_device_id(gpu_uuid, index, self.unit_mib)

    def units_per_gpu(self, gpu_memory_mib: int) -> int:
        """Memory units one GPU of `gpu_memory_mib` MiB advertises (whole units only)."""
        return gpu_memory_mib // self.unit_mib

    # --- annotations ---------------------------------------------------------------------
    @functools.cached_property
    def isolation_annotation(self) -> str:
        """`<prefix>/isolation: mig` asks for a MIG slice instead of memory units."""
        return f"{self.prefix}/isolation"

    @functools.cached_property
    def mig_or_share_annotation(self) -> str:
        """`<prefix>/mig-or-share: "true"` beside `isolation: mig` (DRA mode only): the MIG slice
        when one is free, else a share of a GPU of at least its memory (a prioritized list)."""
        return f"{self.prefix}/mig-or-share"

    @functools.cached_property
    def pod_annotations(self) -> tuple[str, ...]:
        """Every annotation that asks the webhook for a device (KAI's and gpuslice's own): a pod
        carrying any of them is converted or denied, never steered as one asking for no GPU."""
        return (*KAI_ANNOTATIONS, self.isolation_annotation, self.mig_or_share_annotation)

    @functools.cached_property
    def gpu_class_annotation(self) -> str:
        """`<prefix>/gpu-class: any`: a pod whose share depends on the GPU class (a fraction, whole
        GPUs) may take another class than the other pods of its owner (default: the same one)."""
        return f"{self.prefix}/gpu-class"

    @functools.cached_property
    def decision_annotation(self) -> str:
        """Written by the webhook: what it converted and why, for `kubectl describe pod`."""
        return f"{self.prefix}/decision"

    @functools.cached_property
    def pacing_gate(self) -> str:
        """The scheduling gate the webhook puts on converted pods when pacing is on; the pacer removes it."""
        return f"{self.prefix}/pacing"

    @functools.cached_property
    def requeues_annotation(self) -> str:
        """Written by the webhook's requeuer: how often kubelet refused this pod and it was recreated."""
        return f"{self.prefix}/requeues"

    # --- node labels (published by the device plugin, read by the webhook and scheduler) --
    @functools.cached_property
    def label_gpu_product(self) -> str:
        return f"{self.prefix}/gpu.product"

    @functools.cached_property
    def label_gpu_memory_mib(self) -> str:
        return f"{self.prefix}/gpu.memory-mib"

    @functools.cached_property
    def label_gpu_count(self) -> str:
        return f"{self.prefix}/gpu.count"

    @functools.cached_property
    def label_free_block_units(self) -> str:
        """Largest number of free memory units on a single GPU of the node."""
        return f"{self.prefix}/gpu.free-block-units"

    @functools.cached_property
    def label_free_partial_block_units(self) -> str:
        """Largest number of free memory units on a single GPU that is already partly allocated
        ("0" when none): a share that fits there does not break a fully free GPU."""
        return f"{self.prefix}/gpu.free-partial-block-units"

    @functools.cached_property
    def label_free_units(self) -> str:
        """Total free memory units on the node, over all its shared GPUs."""
        return f"{self.prefix}/gpu.free-units"

    @functools.cached_property
    def label_free_cpu_milli(self) -> str:
        """CPU (millicores) of the node's allocatable not yet requested by its pods."""
        return f"{self.prefix}/node.free-cpu-milli"

    @functools.cached_property
    def label_free_memory_mib(self) -> str:
        """Memory (MiB) of the node's allocatable not yet requested by its pods."""
        return f"{self.prefix}/node.free-memory-mib"

    @functools.cached_property
    def label_spare_cpu_milli(self) -> str:
        """CPU (millicores) the node has unrequested beyond `steering.cpuPerGpuMilli` per free GPU
        (free units counted in GPUs); 0 when it has less (then `label_short_cpu_milli` says how much)."""
        return f"{self.prefix}/node.spare-cpu-milli"

    @functools.cached_property
    def label_short_cpu_milli(self) -> str:
        """CPU (millicores) the node lacks to give `steering.cpuPerGpuMilli` to each free GPU; 0 when
        it has that much (label values cannot be negative, so the balance is two labels)."""
        return f"{self.prefix}/node.short-cpu-milli"

    @functools.cached_property
    def label_cpu_per_free_gpu_milli(self) -> str:
        """CPU (millicores) the node has unrequested per free GPU (free units counted in GPUs); 0
        when no GPU memory is free. DRA mode keeps a share that falls back to another GPU class
        off the nodes where it would take more CPU per GPU than the node has for each."""
        return f"{self.prefix}/node.cpu-per-free-gpu-milli"

    @functools.cached_property
    def label_free_gpus(self) -> str:
        """Number of GPUs of the node with every memory unit free."""
        return f"{self.prefix}/gpu.free-gpus"

    def label_mig_free(self, profile: str) -> str:
        """Number of free MIG devices of `profile` on the node (present, maybe "0", where the profile exists)."""
        return f"{self.prefix}/mig.{mig_resource_suffix(profile)}.free"

    def label_mig_memory(self, profile: str) -> str:
        """MiB of memory of one MIG device of `profile` on the node."""
        return f"{self.prefix}/mig.{mig_resource_suffix(profile)}.memory-mib"

    def free_label_of_resource(self, resource: str) -> str | None:
        """The label that counts the free devices of one of our extended resources (memory units:
        `gpu.free-units`; a MIG resource: its `mig.<profile>.free`); None for any other resource."""
        if resource == self.gpu_memory_resource:
            return self.label_free_units
        if resource.startswith(self.mig_resource_prefix):
            return f"{self.prefix}/mig.{resource[len(self.mig_resource_prefix) :]}.free"
        return None

    def mig_profile_of_label(self, key: str) -> str | None:
        """The resource-form profile named by a `label_mig_free` key, else None."""
        head, tail = f"{self.prefix}/mig.", ".free"
        return key[len(head) : -len(tail)] if key.startswith(head) and key.endswith(tail) else None

    @functools.cached_property
    def label_placement_score(self) -> str:
        """0..100: how much real free memory and idle time the node's GPUs have (NVML)."""
        return f"{self.prefix}/gpu.placement-score"

    @functools.cached_property
    def label_pod_cpu_steering(self) -> str:
        """A pod label: `"off"` keeps a pod that asks for no device exactly as written (no
        preference for nodes without a free GPU is added to it)."""
        return f"{self.prefix}/cpu-pod-steering"

    @functools.cached_property
    def label_node_config(self) -> str:
        """Set by operators: the entry of the configuration's nodeConfigs that the device plugin of
        this node layers over the file (docs/configuration.md, "Per-node configuration")."""
        return f"{self.prefix}/config"

    @functools.cached_property
    def label_node_enabled(self) -> str:
        """Set by operators on GPU nodes that run the gpuslice device plugin."""
        return f"{self.prefix}/enabled"

    # --- DRA mode (docs/dra.md) ------------------------------------------------------------
    @functools.cached_property
    def dra_driver(self) -> str:
        """The DRA driver name: ResourceSlice spec.driver, the kubelet plugin's name, the domain
        of its device attributes. ValueError when the prefix makes it longer than the API allows."""
        name = f"gpu.{self.prefix}"
        if len(name) > DRA_MAX_DRIVER_NAME_LENGTH:
            raise ValueError(
                f"DRA driver name {name!r} is {len(name)} characters; the resource.k8s.io API allows "
                f"{DRA_MAX_DRIVER_NAME_LENGTH} (shorten resourcePrefix)"
            )
        return name

    @functools.cached_property
    def dra_device_class(self) -> str:
        """DeviceClass of whole GPUs (of the GPUs shared by memory, taken whole)."""
        return f"gpu.{self.prefix}"

    @functools.cached_property
    def dra_share_device_class(self) -> str:
        """DeviceClass of shares: no selector, so the allocator evaluates no CEL per device; a
        share's request asks `dra_capacity_memory`, which no device but a gpuslice GPU shared by
        memory has, and the allocator skips a device without a capacity asked of it."""
        return f"gpu-share.{self.prefix}"

    @functools.cached_property
    def dra_capacity_memory(self) -> str:
        """The consumable capacity of a GPU shared by memory, qualified by the driver's domain
        ("gpu.gpuslice.io/memory"): a selector still reads it as device.capacity["<driver>"].memory,
        but only these devices have it under this name (not a MIG device, not another driver's)."""
        return f"{self.dra_driver}/{DRA_CAPACITY_MEMORY}"

    @functools.cached_property
    def dra_tag_whole(self) -> str:
        """The tag every GPU shared by memory carries ("gpu.gpuslice.io/whole"): a request of the
        share class asking it and no memory takes a whole GPU (the memory's default is all of it)."""
        return f"{self.dra_driver}/{DRA_TAG_WHOLE}"

    def dra_tag_memory(self, memory_mib: int) -> str:
        """The tag of the GPUs shared by memory of `memory_mib` ("gpu.gpuslice.io/m81920"): the
        whole-GPU request's GPU class, as the gpu.memory-mib label is device-plugin mode's."""
        return f"{self.dra_driver}/{DRA_TAG_MEMORY_PREFIX}{memory_mib}"

    @functools.cached_property
    def dra_mig_device_class(self) -> str:
        """DeviceClass of the MIG devices."""
        return f"mig.{self.prefix}"

    @functools.cached_property
    def dra_cdi_kind(self) -> str:
        """CDI kind of the per-claim devices the DRA plugin writes ("k8s.gpu.gpuslice.io/claim")."""
        return f"k8s.{self.dra_driver}/claim"

    @functools.cached_property
    def dra_unhealthy_taint(self) -> str:
        """Device taint key the DRA plugin puts on a GPU or MIG device NVML reports as failed."""
        return f"{self.dra_driver}/unhealthy"

    @functools.cached_property
    def label_node_dra(self) -> str:
        """Set by operators on GPU nodes that run the DRA plugin instead of the device plugin
        (chart mode "both")."""
        return f"{self.prefix}/dra"

    @functools.cached_property
    def dra_template_label(self) -> str:
        """Label of the ResourceClaimTemplates the webhook creates (value: "webhook")."""
        return f"{self.prefix}/claim-template"
