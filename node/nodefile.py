"""Simulated nodes: a YAML file that describes a node's GPUs, loaded into a NodeInventory.

Schema (docs/node-file.md):

    gpus:
    - uuid: GPU-...            # required, unique
      model: NVIDIA H100 80GB HBM3   # required
      memoryMiB: 81559         # required, 1..1048576 (1 TiB)
      index: 0                 # required, unique
      numaNode: 0              # optional (null: no NUMA affinity)
      minorNumber: 0           # optional
      pciBusId: "0000:19:00.0" # optional
      nvlinks: {GPU-...: 18}   # optional: peer UUID -> link count
      mig:                     # optional: a GPU with this list is in MIG mode
      - {uuid: MIG-..., profile: 1g.10gb, memoryMiB: 9984}

Every error names the file, the GPU and the key.
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Mapping
from typing import Any, Literal, overload

import yaml

from gpuslice.node import inventory

__all__ = ["NodeFileError", "load", "parse", "dump"]

_PROFILE_RE = re.compile(r"^(\d+c\.)?\d+g\.\d+gb([+-](me|me\.all|gfx))?$")
_GPU_KEYS = {"uuid", "model", "memoryMiB", "index", "numaNode", "minorNumber", "pciBusId", "nvlinks", "mig"}
_MIG_KEYS = {"uuid", "profile", "memoryMiB"}


# 1 TiB: several times the largest GPU made (288 GB); a larger value is a typo (MiB read as bytes?).
MAX_GPU_MEMORY_MIB = 1 << 20


class NodeFileError(ValueError):
    """The node file is unreadable or does not follow the schema."""


def load(path: str | os.PathLike[str]) -> inventory.NodeInventory:
    source = str(path)
    try:
        text = pathlib.Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise NodeFileError(f"cannot read node file {source}: {exc.strerror}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise NodeFileError(f"node file {source} is not valid YAML: {exc}") from None
    return parse(document, source=source)


def parse(document: Any, *, source: str = "node file") -> inventory.NodeInventory:
    if not isinstance(document, Mapping) or not isinstance(document.get("gpus"), list):
        raise NodeFileError(f"{source}: must be a mapping with a list under 'gpus'")
    unknown = set(document) - {"gpus"}
    if unknown:
        raise NodeFileError(f"{source}: unknown top-level key {sorted(unknown)[0]!r} (only 'gpus')")
    gpus = [_gpu(entry, f"{source}: gpus[{i}]") for i, entry in enumerate(document["gpus"])]
    try:
        node = inventory.NodeInventory(gpus=tuple(gpus), source=source)
    except ValueError as exc:
        raise NodeFileError(str(exc)) from None
    indexes = [g.index for g in gpus]
    for gpu in gpus:
        if indexes.count(gpu.index) > 1:
            raise NodeFileError(f"{source}: index {gpu.index} is used by more than one GPU")
    known = {g.uuid for g in gpus}
    for gpu in gpus:
        for peer in gpu.nvlinks:
            if peer not in known:
                raise NodeFileError(f"{source}: GPU {gpu.uuid} has nvlinks to unknown GPU {peer}")
    return node


def _gpu(entry: Any, where: str) -> inventory.Gpu:
    if not isinstance(entry, Mapping):
        raise NodeFileError(f"{where}: must be a mapping")
    unknown = set(entry) - _GPU_KEYS
    if unknown:
        raise NodeFileError(f"{where}: unknown key {sorted(unknown)[0]!r}; known: {', '.join(sorted(_GPU_KEYS))}")
    uuid = _string(entry, "uuid", where, required=True)
    where = f"{where} ({uuid})"
    nvlinks = entry.get("nvlinks") or {}
    if not isinstance(nvlinks, Mapping) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v > 0 for k, v in nvlinks.items()
    ):
        raise NodeFileError(f"{where}: nvlinks must map peer GPU UUIDs to positive link counts, got {nvlinks!r}")
    mig_entries = entry.get("mig")
    if mig_entries is not None and not isinstance(mig_entries, list):
        raise NodeFileError(f"{where}: mig must be a list of MIG devices, got {mig_entries!r}")
    mig = tuple(_mig(m, f"{where}: mig[{j}]", uuid) for j, m in enumerate(mig_entries or []))
    memory = _int(entry, "memoryMiB", where, required=True, minimum=1, maximum=MAX_GPU_MEMORY_MIB)
    used = sum(m.memory_mib for m in mig)
    if used > memory:
        raise NodeFileError(f"{where}: MIG devices hold {used} MiB, more than the GPU's memoryMiB {memory}")
    return inventory.Gpu(
        uuid=uuid,
        model=_string(entry, "model", where, required=True),
        memory_mib=memory,
        index=_int(entry, "index", where, required=True, minimum=0),
        numa_node=_int(entry, "numaNode", where, required=False, minimum=0),
        minor_number=_int(entry, "minorNumber", where, required=False, minimum=0),
        pci_bus_id=_string(entry, "pciBusId", where, required=False) or "",
        nvlinks=dict(nvlinks),
        mig_enabled=mig_entries is not None,
        mig=mig,
    )


def _mig(entry: Any, where: str, parent: str) -> inventory.MigDevice:
    if not isinstance(entry, Mapping):
        raise NodeFileError(f"{where}: must be a mapping with uuid, profile, memoryMiB")
    unknown = set(entry) - _MIG_KEYS
    if unknown:
        raise NodeFileError(f"{where}: unknown key {sorted(unknown)[0]!r}; known: {', '.join(sorted(_MIG_KEYS))}")
    profile = _string(entry, "profile", where, required=True)
    if not _PROFILE_RE.match(profile):
        raise NodeFileError(f"{where}: profile {profile!r} is not a MIG profile such as 1g.10gb or 1c.2g.20gb")
    return inventory.MigDevice(
        uuid=_string(entry, "uuid", where, required=True),
        profile=profile,
        memory_mib=_int(entry, "memoryMiB", where, required=True, minimum=1),
        parent_uuid=parent,
    )


@overload
def _string(entry: Mapping[str, Any], key: str, where: str, *, required: Literal[True]) -> str: ...
@overload
def _string(entry: Mapping[str, Any], key: str, where: str, *, required: bool) -> str | None: ...
def _string(entry: Mapping[str, Any], key: str, where: str, *, required: bool) -> str | None:
    value = entry.get(key)
    if value is None:
        if required:
            raise NodeFileError(f"{where}: missing required key {key!r}")
        return None
    if not isinstance(value, str) or not value.strip():
        raise NodeFileError(f"{where}: {key} must be a non-empty string, got {value!r}")
    return value


def _int(
    entry: Mapping[str, Any], key: str, where: str, *, required: bool, minimum: int, maximum: int | None = None
) -> Any:
    value = entry.get(key)
    if value is None:
        if required:
            raise NodeFileError(f"{where}: missing required key {key!r}")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise NodeFileError(f"{where}: {key} must be an integer >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise NodeFileError(f"{where}: {key} {value} is more than any GPU has; the largest allowed is {maximum}")
    return value


def dump(node: inventory.NodeInventory) -> str:
    """The node file for an inventory (e.g. to save what NVML discovered)."""
    gpus = []
    for gpu in node.gpus:
        entry: dict[str, Any] = {"uuid": gpu.uuid, "model": gpu.model, "memoryMiB": gpu.memory_mib, "index": gpu.index}
        if gpu.numa_node is not None:
            entry["numaNode"] = gpu.numa_node
        if gpu.minor_number is not None:
            entry["minorNumber"] = gpu.minor_number
        if gpu.pci_bus_id:
            entry["pciBusId"] = gpu.pci_bus_id
        if gpu.nvlinks:
            entry["nvlinks"] = dict(gpu.nvlinks)
        if gpu.mig_enabled:
            entry["mig"] = [{"uuid": m.uuid, "profile": m.profile, "memoryMiB": m.memory_mib} for m in gpu.mig]
        gpus.append(entry)
    return yaml.safe_dump({"gpus": gpus}, sort_keys=False)
