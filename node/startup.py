"""Start-up checks of the device plugin: a start that would let kubelet promise more GPU memory
than there is, or send kubelet a device list it cannot read, is refused with one line saying
what to do (`StartupError`; main prints it and exits 2).

Device list bounds (issue 13.7). Kubelet receives ListAndWatch with gRPC's default 4 MiB limit;
a unit size small enough (or a node file's memory large enough) to exceed it is refused, naming
the smallest unit size that fits.

Units held at another size (issue 13.3). Kubelet's checkpoint keeps every allocation's device
IDs across plugin restarts and counts them as taken by ID. Device IDs carry the unit size
(gpuslice.contract), so after a change of `memoryUnitMiB` kubelet cannot hand out an old holder's
units a second time as if they were the new size; but it would hand out the *new* IDs of the
same memory, since nothing it knows says they are taken. The plugin therefore reads kubelet's
PodResources before it serves and refuses to start while any container holds units of one of
its GPUs that it would not advertise (another size, or gpuslice 0.1's IDs without a size).
Refusing rather than accounting: a plugin that does not register leaves the resource at zero
allocatable, so nothing new is admitted while the operator deletes the old pods, and the
allocation code keeps a single unit size (docs/deviceplugin.md, "Changing the unit size").

The node served under `migStrategy` (`served_node`, for this plugin and the DRA plugin alike): a
layout the strategy cannot serve is refused the same way.

May import gpuslice.{config,contract}, gpuslice.node.{inventory,migstrategy,podresources}
and the generated v1beta1 messages.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Collection, Iterable

from gpuslice import config as config_
from gpuslice import contract as contract_
from gpuslice.node import inventory, migstrategy, podresources
from gpuslice.proto.deviceplugin.v1beta1 import api_pb2

__all__ = [
    "KUBELET_MAX_MESSAGE_BYTES",
    "HeldUnits",
    "StartupError",
    "check_device_list",
    "check_held_units",
    "foreign_held_units",
    "list_and_watch_bytes",
    "read_held_units",
    "served_node",
]

log = logging.getLogger(__name__)

DOCS_UNIT_SIZE = 'docs/deviceplugin.md, "Changing the unit size"'


class StartupError(Exception):
    """The plugin must not start: the message is one line saying why and what to do."""


@dataclasses.dataclass(frozen=True)
class HeldUnits:
    """Memory units of this node's GPUs that one container holds and this plugin would not advertise."""

    owner: str  # namespace/pod/container
    unit_mib: int | None  # None: an ID without its size (gpuslice 0.1)
    units: int


def foreign_held_units(
    holdings: Iterable[podresources.ContainerDevices],
    advertised: Collection[str],
    node: inventory.NodeInventory,
    names: contract_.Contract,
) -> list[HeldUnits]:
    """Per container and unit size, the held units of this node's memory-shared GPUs that are not
    in `advertised` (the plugin's own device IDs). IDs of other GPUs (replaced, or now in MIG
    mode) are left out: nothing can be allocated twice on them."""
    gpus = {g.uuid for g in node.memory_gpus}
    counts: dict[tuple[str, int | None], int] = {}
    for entry in holdings:
        if entry.resource != names.gpu_memory_resource:
            continue
        owner = f"{entry.namespace}/{entry.pod}/{entry.container}"
        for device_id in entry.device_ids:
            if device_id in advertised or contract_.unit_gpu_uuid(device_id) not in gpus:
                continue
            try:
                size: int | None = contract_.parse_unit_device_id(device_id).unit_mib
            except ValueError:
                size = None
            counts[(owner, size)] = counts.get((owner, size), 0) + 1
    return [HeldUnits(owner, size, n) for (owner, size), n in counts.items()]


def check_held_units(held: Collection[HeldUnits], names: contract_.Contract) -> None:
    """StartupError naming the holders and what to do, when any container holds foreign units."""
    if not held:
        return
    sizes = sorted({h.unit_mib for h in held}, key=lambda s: (s is None, s or 0))
    described = " and ".join(f"{s} MiB" if s is not None else "unknown size (IDs of gpuslice 0.1)" for s in sizes)
    owners = sorted({h.owner for h in held})
    shown = ", ".join(owners[:3]) + (f" and {len(owners) - 3} more" if len(owners) > 3 else "")
    advice = "delete those pods"
    if len(sizes) == 1 and sizes[0] is not None:
        advice += f" or set memoryUnitMiB back to {sizes[0]}"
    raise StartupError(
        f"memoryUnitMiB is {names.unit_mib} but {len(owners)} container(s) on this node hold "
        f"{names.gpu_memory_resource} units of {described} ({shown}); kubelet would promise their memory "
        f"again: {advice}, then restart the plugin ({DOCS_UNIT_SIZE})"
    )


async def read_held_units(
    socket_path: str | os.PathLike[str],
    names: contract_.Contract,
    *,
    attempts: int = 10,
    retry_seconds: float = 1.0,
) -> list[podresources.ContainerDevices] | None:
    """Every container's gpu-memory devices from kubelet's PodResources; None when there is no
    socket (no kubelet on this machine: a demo or a test). A socket that does not answer is
    retried (kubelet may be restarting), then StartupError: starting unchecked could overcommit."""
    if not os.path.exists(socket_path):
        log.warning("no PodResources socket at %s: units held at another unit size cannot be checked", socket_path)
        return None
    error = ""
    for attempt in range(attempts):
        if attempt:
            await asyncio.sleep(retry_seconds)
        try:
            async with podresources.Client(str(socket_path)) as client:
                return await client.container_devices(lambda resource: resource == names.gpu_memory_resource)
        except podresources.PodResourcesError as exc:
            error = str(exc)
    raise StartupError(
        f"cannot read which units pods hold ({error}); the plugin checks this before it serves "
        f"so that a changed memoryUnitMiB cannot overcommit a GPU: is kubelet running?"
    )


# --- the device list kubelet can receive (issue 13.7) ------------------------------------------

# Kubelet reads ListAndWatch with gRPC's default receive limit (4 MiB): a larger message fails
# the stream, and kubelet then counts none of the resource.
KUBELET_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
_WORST_HEALTH = "Unhealthy"  # the longer of the two health strings


def _device_bytes(device_id: str, numa_node: int | None) -> int:
    """Bytes one device adds to a ListAndWatch message (unhealthy: the longer health string)."""
    message = api_pb2.ListAndWatchResponse()
    device = message.devices.add(ID=device_id, health=_WORST_HEALTH)
    if numa_node is not None:
        device.topology.nodes.add(ID=numa_node)
    return message.ByteSize()


def list_and_watch_bytes(node: inventory.NodeInventory, unit_mib: int) -> int:
    """The serialized size of the ListAndWatch message of the node's memory units at `unit_mib`
    (every device unhealthy: the larger case), from one sample device per ID length: no device
    list is built, so an absurd size costs nothing to refuse."""
    total = 0
    for gpu in node.memory_gpus:
        count = gpu.memory_mib // unit_mib
        low, digits = 0, 1
        while low < count:
            high = min(count, 10**digits)  # indexes low..high-1 have `digits` digits
            total += (high - low) * _device_bytes(contract_.unit_device_id(gpu.uuid, low, unit_mib), gpu.numa_node)
            low, digits = high, digits + 1
    return total


def check_device_list(node: inventory.NodeInventory, names: contract_.Contract) -> None:
    """StartupError when the node's memory units at `names.unit_mib` would not fit one ListAndWatch
    message kubelet accepts, or an ID would be longer than kubelet allows; the message names the
    limit and the smallest unit size (and largest GPU memory) that fit."""
    try:
        for gpu in node.memory_gpus:  # the longest ID of each GPU
            contract_.unit_device_id(gpu.uuid, max(0, gpu.memory_mib // names.unit_mib - 1), names.unit_mib)
    except ValueError as exc:
        raise StartupError(f"GPU UUIDs must keep unit device IDs within kubelet's limit: {exc}") from None
    size = list_and_watch_bytes(node, names.unit_mib)
    if size <= KUBELET_MAX_MESSAGE_BYTES:
        return
    # The message shrinks as the unit grows: the smallest unit that fits, by bisection.
    low, high = names.unit_mib, max(g.memory_mib for g in node.memory_gpus)
    while low < high:
        middle = (low + high) // 2
        if list_and_watch_bytes(node, middle) <= KUBELET_MAX_MESSAGE_BYTES:
            high = middle
        else:
            low = middle + 1
    devices = sum(g.memory_mib // names.unit_mib for g in node.memory_gpus)
    per_device = size / devices
    most_mib = int(KUBELET_MAX_MESSAGE_BYTES / per_device) * names.unit_mib
    raise StartupError(
        f"{names.gpu_memory_resource}: {devices:,} devices of {names.unit_mib} MiB make a ListAndWatch message of "
        f"up to {size / 2**20:.1f} MiB, over kubelet's gRPC limit of {KUBELET_MAX_MESSAGE_BYTES // 2**20} MiB: "
        f"the smallest memoryUnitMiB for this node is {low} (at {names.unit_mib} MiB a node may have at most "
        f"{most_mib:,} MiB of GPU memory)"
    )


def served_node(node: inventory.NodeInventory, settings: config_.Config) -> inventory.NodeInventory:
    """The node as `settings.mig_strategy` serves it (node/migstrategy.py); StartupError
    when the layout does not fit the strategy, or with MPS under `single`."""
    strategy = settings.mig_strategy
    if strategy == "single" and settings.mps.enabled:
        # NVIDIA's plugin has no MPS on MIG either; the chart's MPS daemon skips MIG-mode GPUs.
        raise StartupError(
            "mps.enabled cannot be used with migStrategy single: MPS limits are per GPU, "
            "not per MIG device; turn one of them off"
        )
    try:
        served = migstrategy.advertised(node, strategy)
    except migstrategy.MigStrategyError as exc:
        raise StartupError(str(exc)) from None
    skipped = migstrategy.left_out(node, strategy)
    if skipped:
        log.warning(
            "migStrategy none: not advertising %d GPU(s) in MIG mode (%s): their memory belongs to their MIG "
            "devices; use migStrategy mixed or single to serve them",
            len(skipped),
            ", ".join(g.uuid for g in skipped),
        )
    return served
