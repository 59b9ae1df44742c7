"""Helpers for the DRA tests: an in-memory API server, claims as the scheduler allocates them,
kubelet's side of plugin registration and of the DRA calls, and short socket directories.

FakeApi stands in for kube.KubernetesApi with the same coroutine methods; it keeps ResourceSlices
and ResourceClaims as JSON dicts and counts every call, so tests can assert what was read and
written. `register_like_kubelet` follows kubelet's plugin watcher: GetInfo on the registration
socket, checks of the answer, a dial of the DRA endpoint, NotifyRegistrationStatus.
`a100_node_file` writes a node of two A100s in MIG mode (migStrategy's tests); `by_name` indexes
the devices of ResourceSlices by name.
"""

from __future__ import annotations

import asyncio
import copy
import pathlib
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

import grpc
import pytest
import yaml

from gpuslice.dra import kube, preparer, server
from gpuslice.proto.dra.v1 import api_pb2 as v1
from gpuslice.proto.dra.v1 import api_pb2_grpc as v1_grpc
from gpuslice.proto.dra.v1beta1 import api_pb2 as v1beta1
from gpuslice.proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from gpuslice.proto.pluginregistration.v1 import api_pb2 as registration
from gpuslice.proto.pluginregistration.v1 import api_pb2_grpc as registration_grpc

DRIVER = "gpu.gpuslice.io"
H100 = "GPU-21302f2a-76fb-5940-b684-dae50f92c162"  # demo node gpu-0
H100_B = "GPU-eeca949e-f642-56d1-9ca3-6efaa80acfb1"  # demo node gpu-1
MIG_3G = "MIG-a9e5210c-5d91-514d-8f4d-a009532eea8c"  # demo node gpu-2-mig-0


class FakeApi:
    """ClaimApi + SliceApi in memory. `fail` makes the next calls of a method raise."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.slices: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.fail: dict[str, int] = {}
        self.node_uid = "4f3c1f6e-8d1b-4a3e-9c55-0a1b2c3d4e5f"
        self._version = 0
        self.closed = False

    def _check(self, method: str, what: str) -> None:
        self.calls.append((method, what))
        if self.fail.get(method, 0) > 0:
            self.fail[method] -= 1
            error = preparer.ClaimApiError if method == "get_claim" else kube.SliceApiError
            raise error(f"{method} {what}: HTTP 503 Service Unavailable (injected)")

    def add_claim(self, claim: dict[str, Any]) -> None:
        meta = claim["metadata"]
        self.claims[(meta["namespace"], meta["name"])] = claim

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        self._check("get_claim", f"{namespace}/{name}")
        await asyncio.sleep(0)
        try:
            return copy.deepcopy(self.claims[(namespace, name)])
        except KeyError:
            raise preparer.ClaimNotFound(f"GET ResourceClaim {namespace}/{name}: not found") from None

    async def node_owner(self, node_name: str) -> dict[str, str]:
        self._check("node_owner", node_name)
        return {"name": node_name, "uid": self.node_uid}

    async def list_slices(self, node_name: str, driver: str) -> list[dict[str, Any]]:
        self._check("list_slices", node_name)
        return [
            copy.deepcopy(s)
            for s in self.slices.values()
            if s["spec"]["nodeName"] == node_name and s["spec"]["driver"] == driver
        ]

    def _stored(self, obj: dict[str, Any]) -> dict[str, Any]:
        self._version += 1
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(self._version)
        stored["metadata"]["uid"] = f"uid-{stored['metadata']['name']}"
        return stored

    async def create_slice(self, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        self._check("create_slice", name)
        assert name not in self.slices, f"create of existing slice {name}"
        self.slices[name] = self._stored(obj)

    async def replace_slice(self, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        self._check("replace_slice", name)
        assert self.slices[name]["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"], "conflict"
        self.slices[name] = self._stored(obj)

    async def delete_slice(self, name: str) -> None:
        self._check("delete_slice", name)
        self.slices.pop(name, None)

    def close(self) -> None:
        self.closed = True

    def count(self, method: str) -> int:
        return sum(1 for m, _ in self.calls if m == method)


def result(
    request: str,
    device: str,
    memory: str | None = None,
    share_id: str | None = None,
    capacity: str = f"{DRIVER}/memory",
    **extra: Any,
) -> dict[str, Any]:
    """One allocation result as the scheduler writes it (our driver, pool "node-a"): `memory` consumed
    of the device's `capacity`."""
    entry: dict[str, Any] = {"request": request, "driver": DRIVER, "pool": "node-a", "device": device, **extra}
    if memory is not None:
        entry["consumedCapacity"] = {capacity: memory}
    if share_id is not None:
        entry["shareID"] = share_id
    return entry


def claim(
    uid: str, results: Iterable[dict[str, Any]] | None, namespace: str = "team", name: str | None = None
) -> dict[str, Any]:
    """A ResourceClaim; results None: not allocated yet."""
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": namespace, "name": name or f"claim-{uid[:8]}", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
        "status": {},
    }
    if results is not None:
        obj["status"]["allocation"] = {"devices": {"results": list(results)}}
    return obj


def uid(n: int) -> str:
    return f"{n:08x}-0000-4000-8000-000000000000"


def ref(obj: dict[str, Any]) -> preparer.ClaimRef:
    meta = obj["metadata"]
    return preparer.ClaimRef(namespace=meta["namespace"], uid=meta["uid"], name=meta["name"])


@pytest.fixture(name="dirs")
def dirs_fixture() -> Iterator[dict[str, pathlib.Path]]:
    """Short temporary directories (unix socket paths must stay under 108 bytes)."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="gsd-", dir="/tmp"))
    try:
        yield {
            "root": root,
            "plugins": root / "plugins",
            "registry": root / "plugins_registry",
            "cdi": root / "cdi",
            "state": root / "state",
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def register_like_kubelet(registry_dir: pathlib.Path, accept: bool = True) -> registration.PluginInfo:
    """What kubelet's plugin watcher does with a new socket in plugins_registry, for a DRA plugin:
    GetInfo, validate (type, a name, a DRA service version it knows, an endpoint that answers),
    then NotifyRegistrationStatus. Returns the PluginInfo."""
    sockets = sorted(p for p in registry_dir.iterdir() if p.is_socket() and not p.name.startswith("."))
    assert len(sockets) == 1, f"expected one registration socket, found {sockets}"
    async with grpc.aio.insecure_channel(f"unix://{sockets[0]}") as channel:
        stub = registration_grpc.RegistrationStub(channel)
        info = await stub.GetInfo(registration.InfoRequest(), timeout=5)
        problem = ""
        if info.type != server.PLUGIN_TYPE:
            problem = f"unknown plugin type {info.type}"
        elif not info.name:
            problem = "empty plugin name"
        elif not {"v1.DRAPlugin", "v1beta1.DRAPlugin"} & set(info.supported_versions):
            problem = f"none of the supported versions {list(info.supported_versions)} is served by kubelet"
        else:
            async with grpc.aio.insecure_channel(f"unix://{info.endpoint}") as dra:
                await asyncio.wait_for(dra.channel_ready(), 5)
        registered = accept and not problem
        await stub.NotifyRegistrationStatus(
            registration.RegistrationStatus(
                plugin_registered=registered, error=problem or ("" if accept else "refused by test")
            ),
            timeout=5,
        )
    return info


async def prepare(endpoint: pathlib.Path, claims: Iterable[dict[str, Any]], version: str = "v1") -> Any:
    messages, stubs = (v1, v1_grpc) if version == "v1" else (v1beta1, v1beta1_grpc)
    request = messages.NodePrepareResourcesRequest(
        claims=[
            messages.Claim(namespace=c["metadata"]["namespace"], uid=c["metadata"]["uid"], name=c["metadata"]["name"])
            for c in claims
        ]
    )
    async with grpc.aio.insecure_channel(f"unix://{endpoint}") as channel:
        return await stubs.DRAPluginStub(channel).NodePrepareResources(request, timeout=5)


async def unprepare(endpoint: pathlib.Path, claims: Iterable[dict[str, Any]], version: str = "v1") -> Any:
    messages, stubs = (v1, v1_grpc) if version == "v1" else (v1beta1, v1beta1_grpc)
    request = messages.NodeUnprepareResourcesRequest(
        claims=[
            messages.Claim(namespace=c["metadata"]["namespace"], uid=c["metadata"]["uid"], name=c["metadata"]["name"])
            for c in claims
        ]
    )
    async with grpc.aio.insecure_channel(f"unix://{endpoint}") as channel:
        return await stubs.DRAPluginStub(channel).NodeUnprepareResources(request, timeout=5)


PROFILE_MIB = 40192


def a100_node_file(tmp_path, profiles_per_gpu=(("3g.40gb", "3g.40gb"), ("3g.40gb", "3g.40gb"))):
    """Two A100s in MIG mode, each with the MIG devices named (uniform by default)."""
    memory = {"3g.40gb": PROFILE_MIB, "1g.10gb": 9728}
    gpus = [
        {
            "uuid": f"GPU-{index:08d}-0000-0000-0000-000000000000",
            "model": "NVIDIA A100-SXM4-80GB",
            "memoryMiB": 81920,
            "index": index,
            "mig": [
                {"uuid": f"MIG-{index:04d}{j:04d}-0000-0000-0000-000000000000", "profile": p, "memoryMiB": memory[p]}
                for j, p in enumerate(profiles)
            ],
        }
        for index, profiles in enumerate(profiles_per_gpu)
    ]
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump({"gpus": gpus}))
    return path


def by_name(objs):
    return {d["name"]: d for s in objs for d in s["spec"]["devices"]}
