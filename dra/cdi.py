"""CDI spec files for prepared claims: one JSON file per claim in the CDI directory
(/var/run/cdi), read by containerd or CRI-O when a container that uses the claim starts.

Each request of the claim becomes one CDI device, `<contract.dra_cdi_kind>=<claim UID>-<request>`,
whose container edits are what the device plugin's Allocate gives a container for the same
share (gpuslice.node.response, so both modes hand containers the same environment):
NVIDIA_VISIBLE_DEVICES (deviceListStrategy envvar), GPUSLICE_MEMORY_LIMIT_MIB,
GPUSLICE_GPU_FRACTION, GPUSLICE_GPU_COUNT, KAI's GPU_PORTION and, with mps.enabled,
CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, CUDA_MPS_PIPE_DIRECTORY and
the pipe directory mounted. With deviceListStrategy cdi-cri the GPU itself comes from the NVIDIA
toolkit's CDI device (`<cdiKind>=<UUID>`), whose ID is returned beside ours.

cdiVersion 0.5.0: the oldest that allows a device name starting with a digit (claim UIDs may).
Files are written to a temporary name, flushed and renamed, so a runtime never reads half a
spec and a crash leaves the old file or the new one.

May import gpuslice.{config,contract} and gpuslice.node.{allocation,response}.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
from collections.abc import Mapping
from typing import Any

from gpuslice import config as config_
from gpuslice import contract as contract_
from gpuslice.node import allocation, response

__all__ = ["SPEC_VERSION", "ClaimSpec", "claim_spec", "list_claim_files", "remove_spec", "spec_file_name", "write_spec"]

SPEC_VERSION = "0.5.0"
_UID = re.compile(r"^[0-9a-fA-F-]{1,64}$")


@dataclasses.dataclass(frozen=True)
class ClaimSpec:
    """A claim's CDI spec (the JSON document) and the CDI device IDs of each of its requests."""

    document: dict[str, Any]
    ids: dict[str, list[str]]


def spec_file_name(contract: contract_.Contract, claim_uid: str) -> str:
    """'k8s.gpu.gpuslice.io-claim_<uid>.json' (the CDI convention: vendor-class prefix)."""
    if not _UID.match(claim_uid):
        raise ValueError(f"claim UID {claim_uid!r} is not a UID")
    return f"{contract.dra_cdi_kind.replace('/', '-')}_{claim_uid}.json"


def device_name(claim_uid: str, request: str) -> str:
    return f"{claim_uid}-{request}"


def claim_spec(
    contract: contract_.Contract,
    claim_uid: str,
    grants: Mapping[str, allocation.MemoryGrant | allocation.MigGrant],
    settings: config_.Config,
) -> ClaimSpec:
    """The CDI spec of one claim, and for each request the CDI device IDs its containers get."""
    devices = []
    ids: dict[str, list[str]] = {}
    for request, grant in sorted(grants.items()):
        if isinstance(grant, allocation.MigGrant):
            answer = response.mig_response(grant, settings)
        else:
            answer = response.memory_response(grant, settings)
        edits: dict[str, Any] = {"env": [f"{k}={v}" for k, v in sorted(answer.envs.items())]}
        if answer.mounts:
            edits["mounts"] = [
                {
                    "hostPath": m.host_path,
                    "containerPath": m.container_path,
                    "options": ["ro" if m.read_only else "rw", "nosuid", "nodev", "bind"],
                }
                for m in answer.mounts
            ]
        name = device_name(claim_uid, request)
        devices.append({"name": name, "containerEdits": edits})
        ids[request] = [f"{contract.dra_cdi_kind}={name}", *(d.name for d in answer.cdi_devices)]
    document = {"cdiVersion": SPEC_VERSION, "kind": contract.dra_cdi_kind, "devices": devices}
    return ClaimSpec(document, ids)


def write_spec(directory: str | os.PathLike[str], file_name: str, spec: Mapping[str, object]) -> pathlib.Path:
    """Write `spec` as `directory/file_name` atomically (temporary file, fsync, rename)."""
    folder = pathlib.Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / file_name
    temporary = folder / f".{file_name}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(spec, handle, indent=2, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, target)
    _fsync_directory(folder)
    return target


def remove_spec(directory: str | os.PathLike[str], file_name: str) -> bool:
    """Remove a claim's spec file; False when there was none."""
    try:
        (pathlib.Path(directory) / file_name).unlink()
    except FileNotFoundError:
        return False
    _fsync_directory(pathlib.Path(directory))
    return True


def list_claim_files(directory: str | os.PathLike[str], contract: contract_.Contract) -> dict[str, str]:
    """Claim UID -> spec file name of every claim spec of this driver in `directory`."""
    head = contract.dra_cdi_kind.replace("/", "-") + "_"
    found = {}
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return {}
    for name in names:
        if name.startswith(head) and name.endswith(".json"):
            found[name[len(head) : -len(".json")]] = name
    return found


def _fsync_directory(folder: pathlib.Path) -> None:
    """Make a rename or unlink durable (the directory entry itself)."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
