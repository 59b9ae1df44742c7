"""The ResourceSlices (resource.k8s.io/v1) that describe one node's GPUs to the DRA allocator.
Pure: no I/O, no clock (timestamps are passed in).

* One device per GPU not in MIG mode, `allowMultipleAllocations: true`, with one consumable
  capacity, `<driver>/memory` (the GPU's memory; Contract.dra_capacity_memory), whose request
  policy rounds every request up to whole memory units: validRange{min: unit, max: whole units,
  step: unit}, default: all whole units. A request without a capacity therefore takes the whole
  GPU; `capacity.requests["gpu.gpuslice.io/memory"]: 2000Mi` takes 2048Mi with 256 MiB units.
  Qualified so that no other device has it (a MIG device's memory is plain `memory`): the share
  class then needs no CEL selector (Contract.dra_share_device_class). The scheduler sums the
  shares per GPU, so no GPU is given more than it has and no share spans GPUs.
  Two tags beside it, `<driver>/whole` and `<driver>/m<memoryMiB>`: capacities of 1 that a share
  consumes none of, so a whole-GPU request of the share class picks a GPU (of one memory size) by
  asking a tag, where a CEL selector would be evaluated on every device (contract.DRA_TAG_WHOLE).
* One device per MIG device (static: as the node is partitioned now), allocated whole. Under
  `migStrategy` single each MIG device is shared by memory like a GPU instead (the node comes
  from node/migstrategy.py's view), with its GPU's UUID as parentUUID; under none GPUs in
  MIG mode are left out.
* Attributes (names in gpuslice.contract): type, uuid, product (label form), productName,
  memoryMiB, index, minor, pciBusID, numaNode, nvlinkPeers, nvlinkDomain; MIG devices add
  migProfile, parentUUID, parentIndex.
* Health: a failed GPU or MIG device carries the taint `<driver>/unhealthy` (NoSchedule): new
  claims keep off it, running pods stay.
* The pool is the node; devices are split into slices of at most 64 (the API's limit once any
  device carries a taint: splitting at 64 always keeps a health change from reshaping slices).

`check_slice` checks a slice against the API's own limits (lengths, counts, request policy
arithmetic) so a bad slice is refused here with a message instead of by the API server.

May import gpuslice.{contract,quantity} and gpuslice.node.inventory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuslice import contract as contract_
from gpuslice import quantity
from gpuslice.node import inventory

__all__ = [
    "API_VERSION",
    "MAX_DEVICES_PER_SLICE",
    "SliceError",
    "Taint",
    "build_slices",
    "check_slice",
    "device_name",
    "devices",
    "mig_device_name",
]

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceSlice"

# resource.k8s.io/v1 limits (k8s.io/api resource/v1 types.go).
MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_WITH_TAINTS = 64  # ResourceSliceMaxDevicesWithAdvancedFeatures
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ATTRIBUTE_VALUE_LENGTH = 64
MAX_ID_LENGTH = 32  # the name part of an attribute or capacity name
MAX_TAINTS = 16
MAX_NAME_LENGTH = 253
DNS_LABEL_MAX = 63
# Devices per slice we publish: the taint limit, always (see the module docstring).
DEVICES_PER_SLICE = MAX_DEVICES_WITH_TAINTS

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")


class SliceError(ValueError):
    """A ResourceSlice would break a limit of the resource.k8s.io API."""


@dataclasses.dataclass(frozen=True)
class Taint:
    """Why a device is tainted, and since when (RFC 3339, UTC)."""

    reason: str
    since: str


def device_name(gpu: inventory.Gpu) -> str:
    """'gpu-0': the GPU's DRA device name (a DNS label, stable while the GPU keeps its index)."""
    return f"gpu-{gpu.index}"


def mig_device_name(parent: inventory.Gpu, position: int) -> str:
    """'gpu-2-mig-0': the MIG device at `position` of its parent's MIG list."""
    return f"gpu-{parent.index}-mig-{position}"


def _string(value: str) -> dict[str, str]:
    return {"string": value[:MAX_ATTRIBUTE_VALUE_LENGTH]}


def _nvlink_domains(node: inventory.NodeInventory) -> dict[str, str]:
    """GPU UUID -> 'nvl-<lowest index>' of the set of GPUs it reaches over NVLink (itself alone
    when it has none): a claim for several GPUs can require one NVLink domain with matchAttribute."""
    parent = {g.uuid: g.uuid for g in node.gpus}

    def find(uuid: str) -> str:
        while parent[uuid] != uuid:
            parent[uuid] = parent[parent[uuid]]
            uuid = parent[uuid]
        return uuid

    for gpu in node.gpus:
        for peer, links in gpu.nvlinks.items():
            if links > 0 and peer in parent:
                parent[find(peer)] = find(gpu.uuid)
    lowest: dict[str, int] = {}
    for gpu in node.gpus:
        root = find(gpu.uuid)
        lowest[root] = min(lowest.get(root, gpu.index), gpu.index)
    return {g.uuid: f"nvl-{lowest[find(g.uuid)]}" for g in node.gpus}


def _common_attributes(gpu: inventory.Gpu) -> dict[str, dict[str, Any]]:
    attributes: dict[str, dict[str, Any]] = {
        contract_.DRA_ATTR_PRODUCT: _string(contract_.label_value(gpu.model)),
        contract_.DRA_ATTR_PRODUCT_NAME: _string(gpu.model),
    }
    if gpu.numa_node is not None:
        attributes[contract_.DRA_ATTR_NUMA_NODE] = {"int": gpu.numa_node}
    return attributes


def _taints(taint: Taint | None, key: str) -> dict[str, Any]:
    if taint is None:
        return {}
    value = contract_.label_value(taint.reason)
    return {"taints": [{"key": key, "value": value, "effect": "NoSchedule", "timeAdded": taint.since}]}


def _tag() -> dict[str, Any]:
    """A tag: a capacity of 1 that a request consumes only by asking it (the default is 0), so
    shares never run out of it and a whole-GPU request selects by it (contract.DRA_TAG_WHOLE)."""
    return {"value": "1", "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "1"}}}


def gpu_device(
    gpu: inventory.Gpu,
    contract: contract_.Contract,
    *,
    nvlink_domain: str,
    nvlink_peers: int,
    taint: Taint | None = None,
) -> dict[str, Any] | None:
    """The shared device of a GPU not in MIG mode; None when it holds less than one memory unit."""
    units = contract.units_per_gpu(gpu.memory_mib)
    if units < 1:
        return None
    whole = units * contract.unit_mib
    valid_range: dict[str, str] = {"min": quantity.mebibytes(contract.unit_mib), "max": quantity.mebibytes(whole)}
    if units >= 2:  # the API wants min + step within the capacity
        valid_range["step"] = quantity.mebibytes(contract.unit_mib)
    attributes = {
        contract_.DRA_ATTR_TYPE: {"string": contract_.DRA_TYPE_GPU},
        contract_.DRA_ATTR_UUID: _string(gpu.uuid),
        **_common_attributes(gpu),
        contract_.DRA_ATTR_MEMORY_MIB: {"int": gpu.memory_mib},
        contract_.DRA_ATTR_INDEX: {"int": gpu.index},
        contract_.DRA_ATTR_NVLINK_PEERS: {"int": nvlink_peers},
        contract_.DRA_ATTR_NVLINK_DOMAIN: {"string": nvlink_domain},
    }
    if gpu.minor_number is not None:
        attributes[contract_.DRA_ATTR_MINOR] = {"int": gpu.minor_number}
    if gpu.pci_bus_id:
        attributes[contract_.DRA_ATTR_PCI_BUS_ID] = _string(gpu.pci_bus_id)
    if gpu.parent_uuid:  # a MIG device shared by memory (migStrategy single)
        attributes[contract_.DRA_ATTR_PARENT_UUID] = _string(gpu.parent_uuid)
    return {
        "name": device_name(gpu),
        "allowMultipleAllocations": True,
        "attributes": attributes,
        "capacity": {
            contract.dra_capacity_memory: {
                "value": quantity.mebibytes(gpu.memory_mib),
                "requestPolicy": {"default": quantity.mebibytes(whole), "validRange": valid_range},
            },
            contract.dra_tag_whole: _tag(),
            contract.dra_tag_memory(gpu.memory_mib): _tag(),
        },
        **_taints(taint, contract.dra_unhealthy_taint),
    }


def mig_device(
    mig: inventory.MigDevice, parent: inventory.Gpu, position: int, contract: contract_.Contract, taint: Taint | None
) -> dict[str, Any]:
    """A MIG device, allocated whole (no allowMultipleAllocations)."""
    attributes = {
        contract_.DRA_ATTR_TYPE: {"string": contract_.DRA_TYPE_MIG},
        contract_.DRA_ATTR_UUID: _string(mig.uuid),
        **_common_attributes(parent),
        contract_.DRA_ATTR_MEMORY_MIB: {"int": mig.memory_mib},
        contract_.DRA_ATTR_MIG_PROFILE: _string(mig.profile),
        contract_.DRA_ATTR_PARENT_UUID: _string(parent.uuid),
        contract_.DRA_ATTR_PARENT_INDEX: {"int": parent.index},
    }
    return {
        "name": mig_device_name(parent, position),
        "attributes": attributes,
        "capacity": {contract_.DRA_CAPACITY_MEMORY: {"value": quantity.mebibytes(mig.memory_mib)}},
        **_taints(taint, contract.dra_unhealthy_taint),
    }


def devices(
    node: inventory.NodeInventory, contract: contract_.Contract, taints: Mapping[str, Taint] | None = None
) -> list[dict[str, Any]]:
    """Every device of the node, GPUs in index order, each GPU's MIG devices after it.

    `taints` maps a GPU or MIG UUID (or "*" for the whole node) to its Taint; a GPU's taint also
    covers its MIG devices, shared or not.
    """
    taints = taints or {}
    everything = taints.get("*")
    domains = _nvlink_domains(node)
    result: list[dict[str, Any]] = []
    for gpu in sorted(node.gpus, key=lambda g: g.index):
        gpu_taint = everything or taints.get(gpu.uuid) or (taints.get(gpu.parent_uuid) if gpu.parent_uuid else None)
        if gpu.mig_enabled:
            for position, mig in enumerate(gpu.mig):
                result.append(mig_device(mig, gpu, position, contract, gpu_taint or taints.get(mig.uuid)))
            continue
        peers = sum(1 for peer in node.gpus if peer.uuid != gpu.uuid and node.nvlinks(gpu.uuid, peer.uuid) > 0)
        device = gpu_device(gpu, contract, nvlink_domain=domains[gpu.uuid], nvlink_peers=peers, taint=gpu_taint)
        if device is not None:
            result.append(device)
    return result


def slice_name(node_name: str, driver: str, index: int) -> str:
    """'<node>-<driver>-<index>', shortened with a hash when the node name is very long."""
    name = f"{node_name}-{driver}-{index}"
    if len(name) <= MAX_NAME_LENGTH:
        return name
    digest = hashlib.sha256(node_name.encode()).hexdigest()[:10]
    keep = MAX_NAME_LENGTH - len(f"-{digest}-{driver}-{index}")
    return f"{node_name[:keep].rstrip('-.')}-{digest}-{driver}-{index}"


def build_slices(
    node: inventory.NodeInventory,
    contract: contract_.Contract,
    node_name: str,
    *,
    generation: int = 1,
    taints: Mapping[str, Taint] | None = None,
    owner: Mapping[str, str] | None = None,
    devices_per_slice: int = DEVICES_PER_SLICE,
) -> list[dict[str, Any]]:
    """The node's ResourceSlices (at least one, possibly with no device, so the pool exists).

    `owner` ({"name", "uid"} of the Node) adds an ownerReference, so the slices go with the Node.
    Raises SliceError when a slice breaks an API limit.
    """
    driver = contract.dra_driver
    all_devices = devices(node, contract, taints)
    chunks = [all_devices[i : i + devices_per_slice] for i in range(0, len(all_devices), devices_per_slice)] or [[]]
    result = []
    for index, chunk in enumerate(chunks):
        metadata: dict[str, Any] = {"name": slice_name(node_name, driver, index)}
        if owner:
            metadata["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": owner["name"], "uid": owner["uid"], "controller": True}
            ]
        obj = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": metadata,
            "spec": {
                "driver": driver,
                "nodeName": node_name,
                "pool": {"name": node_name, "generation": generation, "resourceSliceCount": len(chunks)},
                "devices": chunk,
            },
        }
        problems = check_slice(obj)
        if problems:
            raise SliceError(f"ResourceSlice {metadata['name']}: " + "; ".join(problems))
        result.append(obj)
    return result


# --- the API's limits --------------------------------------------------------------------------


def _check_qualified_name(name: str, where: str) -> list[str]:
    domain, sep, ident = name.rpartition("/")
    problems = []
    if sep and (not domain or len(domain) > DNS_LABEL_MAX or not _DNS_SUBDOMAIN.match(domain)):
        problems.append(f"{where}: domain of {name!r} is not a DNS subdomain of at most {DNS_LABEL_MAX} characters")
    if len(ident) > MAX_ID_LENGTH or not _C_IDENTIFIER.match(ident):
        problems.append(f"{where}: {ident!r} is not a C identifier of at most {MAX_ID_LENGTH} characters")
    return problems


def _check_request_policy(capacity: Mapping[str, Any], where: str) -> list[str]:
    """The arithmetic the API server checks (pkg/apis/resource/validation: validateRequestPolicyRange),
    on what gpuslice publishes: memory in whole Mi, tags in plain integers; anything else is refused."""
    policy = capacity.get("requestPolicy")
    if policy is None:
        return []
    written_in_mi = isinstance(capacity.get("value"), str) and capacity["value"].endswith("Mi")
    unit, read = ("Mi", quantity.whole_mebibytes) if written_in_mi else ("", _whole_number)
    value = read(capacity.get("value"))
    default = read(policy.get("default"))
    valid = policy.get("validRange") or {}
    low, high, step = read(valid.get("min")), read(valid.get("max")), read(valid.get("step"))
    if (
        None in (value, default, low)
        or (valid.get("max") is not None and high is None)
        or (valid.get("step") is not None and step is None)
    ):
        return [f"{where}: quantities must be whole {unit or 'numbers'} (value, default, validRange.min/max/step)"]
    assert value is not None and default is not None and low is not None
    problems = []
    if low > value:
        problems.append(f"{where}: validRange.min {low}{unit} is larger than the capacity {value}{unit}")
    if default < low:
        problems.append(f"{where}: default {default}{unit} is less than validRange.min {low}{unit}")
    if high is not None:
        if high > value:
            problems.append(f"{where}: validRange.max {high}{unit} is larger than the capacity {value}{unit}")
        if default > high or low > high:
            problems.append(f"{where}: default and min must be at most validRange.max {high}{unit}")
    if step is not None:
        if step <= 0 or low + step > value:
            problems.append(f"{where}: validRange.step {step}{unit}: min + step must fit the capacity {value}{unit}")
        else:
            for name, amount in (("default", default), ("max", high)):
                if amount is not None and (amount - low) % step:
                    problems.append(f"{where}: {name} {amount}{unit} is not min + a multiple of step {step}{unit}")
    return problems


def _whole_number(value: Any) -> int | None:
    """A tag's quantity written as a plain non-negative integer ("1"); None for any other spelling."""
    return int(value) if isinstance(value, str) and value.isascii() and value.isdigit() else None


def check_slice(obj: Mapping[str, Any]) -> list[str]:
    """What in `obj` the API server would refuse (empty when nothing): names, counts, lengths,
    taints and request policies. The OpenAPI schema (field names, types) is checked in tests."""
    problems: list[str] = []
    name = obj.get("metadata", {}).get("name", "")
    if not name or len(name) > MAX_NAME_LENGTH or not _DNS_SUBDOMAIN.match(name):
        problems.append(f"metadata.name {name!r} is not a DNS subdomain of at most {MAX_NAME_LENGTH} characters")
    spec = obj.get("spec") or {}
    driver = spec.get("driver", "")
    if len(driver) > contract_.DRA_MAX_DRIVER_NAME_LENGTH or not _DNS_SUBDOMAIN.match(driver):
        problems.append(f"spec.driver {driver!r} is not a DNS subdomain of at most 63 characters")
    pool = spec.get("pool") or {}
    if not pool.get("name") or len(pool["name"]) > MAX_NAME_LENGTH:
        problems.append("spec.pool.name must be 1 to 253 characters")
    if int(pool.get("resourceSliceCount", 0)) < 1:
        problems.append("spec.pool.resourceSliceCount must be at least 1")
    device_list: Sequence[Mapping[str, Any]] = spec.get("devices") or ()
    tainted = any(d.get("taints") for d in device_list)
    limit = MAX_DEVICES_WITH_TAINTS if tainted else MAX_DEVICES_PER_SLICE
    if len(device_list) > limit:
        problems.append(f"spec.devices has {len(device_list)} devices; the limit is {limit}")
    seen: set[str] = set()
    for i, device in enumerate(device_list):
        where = f"spec.devices[{i}]"
        dname = device.get("name", "")
        if len(dname) > DNS_LABEL_MAX or not _DNS_LABEL.match(dname):
            problems.append(f"{where}.name {dname!r} is not a DNS label")
        if dname in seen:
            problems.append(f"{where}.name {dname!r} is used twice")
        seen.add(dname)
        attributes = device.get("attributes") or {}
        capacity = device.get("capacity") or {}
        if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
            problems.append(f"{where}: {len(attributes) + len(capacity)} attributes and capacities; the limit is 32")
        for key, attribute in attributes.items():
            problems += _check_qualified_name(key, f"{where}.attributes")
            if len(attribute) != 1:
                problems.append(f"{where}.attributes[{key}] must have exactly one value field")
            text = attribute.get("string", attribute.get("version"))
            if isinstance(text, str) and len(text) > MAX_ATTRIBUTE_VALUE_LENGTH:
                problems.append(f"{where}.attributes[{key}] is longer than {MAX_ATTRIBUTE_VALUE_LENGTH} characters")
        for key, entry in capacity.items():
            problems += _check_qualified_name(key, f"{where}.capacity")
            if entry.get("requestPolicy") is not None and not device.get("allowMultipleAllocations"):
                problems.append(f"{where}.capacity[{key}].requestPolicy needs allowMultipleAllocations")
            problems += _check_request_policy(entry, f"{where}.capacity[{key}]")
        taints = device.get("taints") or ()
        if len(taints) > MAX_TAINTS:
            problems.append(f"{where}: {len(taints)} taints; the limit is {MAX_TAINTS}")
        for taint in taints:
            if taint.get("effect") not in TAINT_EFFECTS:
                problems.append(f"{where}: taint effect {taint.get('effect')!r} is not one of {TAINT_EFFECTS}")
            if not _LABEL_VALUE.match(taint.get("value", "")) or len(taint.get("value", "")) > DNS_LABEL_MAX:
                problems.append(f"{where}: taint value {taint.get('value')!r} is not a label value")
    return problems


def comparable(slices: Iterable[Mapping[str, Any]]) -> list[tuple[str, Any]]:
    """(name, spec without pool generation and taint times) of each slice: equal lists mean the
    published state needs no write."""
    result = []
    for obj in slices:
        spec = dict(obj.get("spec") or {})
        pool = dict(spec.get("pool") or {})
        pool.pop("generation", None)
        spec["pool"] = pool
        spec["devices"] = [
            {**d, "taints": [{k: v for k, v in t.items() if k != "timeAdded"} for t in d["taints"]]}
            if d.get("taints")
            else {k: v for k, v in d.items() if k != "taints"}
            for d in spec.get("devices") or ()
        ]
        result.append((obj.get("metadata", {}).get("name", ""), _normal(spec)))
    return sorted(result, key=lambda item: item[0])


def _normal(value: Any) -> Any:
    """Drop empty/None fields the API server may leave out or fill in, for comparisons."""
    if isinstance(value, Mapping):
        return {k: _normal(v) for k, v in value.items() if v not in (None, [], {}, False)}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    return value
