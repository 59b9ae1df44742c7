"""`migStrategy`: the view of the node's GPUs that the plugin advertises, labels and monitors.

NVIDIA's device plugin has three MIG strategies; gpuslice keeps their meaning and maps them onto
its own resources (docs/deviceplugin.md, "MIG strategies"):

- `mixed` (the default; what gpuslice always did): GPUs not in MIG mode are shared as
  `<prefix>/gpu-memory` units, each MIG profile is its own `<prefix>/mig-<profile>` resource.
- `single`: every GPU is in MIG mode with MIG devices of one type, and those devices are the
  plain resource. gpuslice's plain resource is `gpu-memory`, so each MIG device is shared by
  memory units as if it were a small GPU (a share never spans two MIG devices); no `mig-<profile>`
  resource. A node that is not uniform is refused, as NVIDIA's plugin refuses to start.
- `none`: MIG is not gpuslice's business: no `mig-<profile>` resource, and GPUs in MIG mode are
  left out (their memory belongs to their MIG instances, so units of it could not be used).

Pure: a NodeInventory in, a NodeInventory out. May import gpuslice.node.inventory.
"""

from __future__ import annotations

from gpuslice.node import inventory

__all__ = ["MigStrategyError", "advertised", "left_out"]


class MigStrategyError(ValueError):
    """The node's MIG layout does not fit the strategy: one line saying why and what to do."""


def advertised(node: inventory.NodeInventory, strategy: str) -> inventory.NodeInventory:
    """The GPUs the plugin serves under `strategy` (one of config.MIG_STRATEGIES)."""
    if strategy == "mixed":
        return node
    if strategy == "none":
        return inventory.NodeInventory(tuple(g for g in node.gpus if not g.mig_enabled), source=node.source)
    if strategy == "single":
        _check_uniform(node)
        return inventory.NodeInventory(_mig_devices_as_gpus(node), source=node.source)
    raise ValueError(f"unknown migStrategy {strategy!r}")


def left_out(node: inventory.NodeInventory, strategy: str) -> tuple[inventory.Gpu, ...]:
    """GPUs in MIG mode that `none` does not advertise (for the start-up log)."""
    return tuple(g for g in node.gpus if g.mig_enabled) if strategy == "none" else ()


def _check_uniform(node: inventory.NodeInventory) -> None:
    """What NVIDIA's plugin requires of `single`: every GPU in MIG mode, each with MIG devices,
    and all MIG devices of one type (profile and memory)."""
    where = "migStrategy single needs every GPU in MIG mode with MIG devices of one profile"
    plain = [g for g in node.gpus if not g.mig_enabled]
    if plain:
        raise MigStrategyError(f"{where}, but {_name(plain[0])} is not in MIG mode: use migStrategy mixed on this node")
    empty = [g for g in node.gpus if not g.mig]
    if empty:
        raise MigStrategyError(f"{where}, but {_name(empty[0])} has no MIG devices: create them or use mixed")
    types = sorted({(m.profile, m.memory_mib) for m in node.mig_devices()})
    if len(types) > 1:
        shown = ", ".join(f"{profile} ({mib} MiB)" for profile, mib in types)
        raise MigStrategyError(f"{where}, but this node has {shown}: use migStrategy mixed on this node")


def _mig_devices_as_gpus(node: inventory.NodeInventory) -> tuple[inventory.Gpu, ...]:
    gpus: list[inventory.Gpu] = []
    for gpu in sorted(node.gpus, key=lambda g: g.index):
        for mig in gpu.mig:
            gpus.append(
                inventory.Gpu(
                    uuid=mig.uuid,
                    # GPU feature discovery's form under single: "<product>-MIG-<profile>"
                    model=f"{gpu.model} MIG {mig.profile}",
                    memory_mib=mig.memory_mib,
                    index=len(gpus),
                    numa_node=gpu.numa_node,
                    pci_bus_id=gpu.pci_bus_id,
                    parent_uuid=gpu.uuid,
                )
            )
    return tuple(gpus)


def _name(gpu: inventory.Gpu) -> str:
    return f"GPU {gpu.index} ({gpu.uuid})"
