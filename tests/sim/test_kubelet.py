"""The kubelet emulator (sim/kubelet.py) plays kubelet's side of both protocols faithfully."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from kubelet_emulator import AdmissionError, kubelet_fixture, plugins, socket_dir_fixture  # noqa: F401 - fixtures

from gpuslice.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from gpuslice.proto.podresources.v1 import api_pb2 as pr_pb2
from gpuslice.proto.podresources.v1 import api_pb2_grpc as pr_grpc
from gpuslice.sim import kubelet as sim_kubelet

pytestmark = pytest.mark.usefixtures("no_leftover_tasks")

MEMORY = "gpuslice.io/gpu-memory"
H100_A = "GPU-21302f2a-76fb-5940-b684-dae50f92c162"


class RecordingPlugin(api_pb2_grpc.DevicePluginServicer):
    """A scripted device plugin: fixed devices, a fixed preferred answer, every call recorded."""

    def __init__(self, devices: list[str], *, preferred: list[str], preferred_available: bool = True) -> None:
        self.devices = devices
        self.preferred = preferred
        self.preferred_available = preferred_available
        self.calls: list[str] = []
        self.allocated: list[list[str]] = []

    async def GetDevicePluginOptions(self, request, context):
        self.calls.append("GetDevicePluginOptions")
        return api_pb2.DevicePluginOptions(get_preferred_allocation_available=self.preferred_available)

    async def ListAndWatch(self, request, context):
        self.calls.append("ListAndWatch")
        yield api_pb2.ListAndWatchResponse(devices=[api_pb2.Device(ID=d, health="Healthy") for d in self.devices])
        await asyncio.Event().wait()  # until the stream is cancelled

    async def GetPreferredAllocation(self, request, context):
        self.calls.append("GetPreferredAllocation")
        return api_pb2.PreferredAllocationResponse(
            container_responses=[api_pb2.ContainerPreferredAllocationResponse(deviceIDs=self.preferred)]
        )

    async def Allocate(self, request, context):
        self.calls.append("Allocate")
        self.allocated.append(list(request.container_requests[0].devices_ids))
        return api_pb2.AllocateResponse(container_responses=[api_pb2.ContainerAllocateResponse()])


async def serve_and_register(plugin, socket_dir, resource="example.com/thing", version="v1beta1"):
    server = grpc.aio.server()
    api_pb2_grpc.add_DevicePluginServicer_to_server(plugin, server)
    server.add_insecure_port(f"unix://{socket_dir / 'thing.sock'}")
    await server.start()
    async with grpc.aio.insecure_channel(f"unix://{socket_dir / 'kubelet.sock'}") as channel:
        await api_pb2_grpc.RegistrationStub(channel).Register(
            api_pb2.RegisterRequest(version=version, endpoint="thing.sock", resource_name=resource)
        )
    return server


@pytest.mark.parametrize(
    ("version", "resource", "endpoint", "message"),
    [
        ("v1alpha", "example.com/thing", "thing.sock", "requested API version 'v1alpha' is not supported"),
        ("v1beta1", "thing", "thing.sock", "the ResourceName 'thing' is invalid"),
        ("v1beta1", "kubernetes.io/thing", "thing.sock", "is invalid"),
        ("v1beta1", "requests.example.com/thing", "thing.sock", "is invalid"),
        ("v1beta1", "example.com/thing", "nobody-serves-this.sock", "failed to dial device plugin"),
    ],
    ids=["bad-version", "not-extended", "native-domain", "requests-prefix", "nothing-serving"],
)
async def test_register_is_refused_as_kubelet_refuses_it(
    kubelet, socket_dir, version, resource, endpoint, message, monkeypatch
):
    monkeypatch.setattr(sim_kubelet, "_DIAL_TIMEOUT_S", 0.2)
    async with grpc.aio.insecure_channel(f"unix://{socket_dir / 'kubelet.sock'}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await api_pb2_grpc.RegistrationStub(channel).Register(
                api_pb2.RegisterRequest(version=version, endpoint=endpoint, resource_name=resource)
            )
    assert message in failure.value.details()
    assert kubelet.registrations == [] and kubelet.endpoints == {}


async def test_kubelet_falls_back_to_arbitrary_devices_when_the_preferred_answer_is_short(kubelet, socket_dir):
    plugin = RecordingPlugin(["d0", "d1", "d2", "d3"], preferred=["d3", "gone"])
    server = await serve_and_register(plugin, socket_dir)
    try:
        await kubelet.wait_for_resource("example.com/thing", 4)
        await kubelet.allocate("example.com/thing", 3, "ns/p/c")
        assert plugin.allocated == [["d3", "d0", "d1"]]
        assert plugin.calls[:2] == ["GetDevicePluginOptions", "ListAndWatch"]
        assert plugin.calls[2:] == ["GetPreferredAllocation", "Allocate"]
    finally:
        await kubelet.stop()
        await server.stop(0)


async def test_kubelet_skips_get_preferred_allocation_when_the_plugin_did_not_offer_it(kubelet, socket_dir):
    plugin = RecordingPlugin(["d0", "d1"], preferred=["d1"], preferred_available=False)
    server = await serve_and_register(plugin, socket_dir)
    try:
        await kubelet.wait_for_resource("example.com/thing", 2)
        await kubelet.allocate("example.com/thing", 1, "ns/p/c")
        assert "GetPreferredAllocation" not in plugin.calls
        assert plugin.allocated == [["d0"]]
    finally:
        await kubelet.stop()
        await server.stop(0)


async def test_allocating_an_unregistered_resource_is_an_admission_error(kubelet):
    with pytest.raises(AdmissionError, match="unregistered device example.com/none"):
        await kubelet.allocate("example.com/none", 1, "ns/p/c")


async def test_a_restart_deletes_every_file_but_the_checkpoint_and_directories(kubelet, socket_dir):
    (socket_dir / "kubelet_internal_checkpoint").write_text("{}")
    (socket_dir / "other-plugin.sock").write_text("")
    (socket_dir / "DEPRECATION").write_text("")
    (socket_dir / "subdir").mkdir()
    await kubelet.restart()
    assert sorted(p.name for p in socket_dir.iterdir()) == ["kubelet.sock", "kubelet_internal_checkpoint", "subdir"]


async def test_pod_resources_lists_what_was_allocated_with_the_advertised_ids(kubelet, socket_dir, demo_node):
    async with plugins(demo_node, socket_dir):
        await kubelet.wait_for_resource(MEMORY, 636)
        await kubelet.wait_for_resource("gpuslice.io/mig-2g.20gb", 1)
        await kubelet.allocate(MEMORY, 3, "team/train/main")
        await kubelet.allocate("gpuslice.io/mig-2g.20gb", 1, "team/train/sidecar")
        await kubelet.allocate(MEMORY, 1, "solo/worker")
        async with grpc.aio.insecure_channel(f"unix://{kubelet.pod_resources_socket}") as channel:
            lister = pr_grpc.PodResourcesListerStub(channel)
            listed = await lister.List(pr_pb2.ListPodResourcesRequest())
            got = await lister.Get(pr_pb2.GetPodResourcesRequest(pod_name="train", pod_namespace="team"))
            allocatable = await lister.GetAllocatableResources(pr_pb2.AllocatableResourcesRequest())
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await lister.Get(pr_pb2.GetPodResourcesRequest(pod_name="nope", pod_namespace="team"))

    pods = {(p.namespace, p.name): p for p in listed.pod_resources}
    assert set(pods) == {("team", "train"), ("default", "solo")}
    train = {c.name: c for c in pods["team", "train"].containers}
    main_devices = [d for entry in train["main"].devices for d in entry.device_ids]
    assert main_devices == sorted(kubelet.allocated("team/train/main")[MEMORY])
    assert all(entry.resource_name == MEMORY and len(entry.device_ids) == 1 for entry in train["main"].devices)
    assert [n.ID for n in train["main"].devices[0].topology.nodes] == [0]
    assert [d for e in train["sidecar"].devices for d in e.device_ids] == list(
        kubelet.allocated("team/train/sidecar")["gpuslice.io/mig-2g.20gb"]
    )
    assert got.pod_resources == pods["team", "train"]
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    free = [d for e in allocatable.devices if e.resource_name == MEMORY for d in e.device_ids]
    assert len(free) == 636 and f"{H100_A}::256Mi::0" in free


@pytest.mark.parametrize(
    ("owner", "parts"),
    [("ns/pod/ctr", ("ns", "pod", "ctr")), ("pod/ctr", ("default", "pod", "ctr")), ("pod", ("default", "pod", "pod"))],
)
def test_owner_keys_name_namespace_pod_and_container(owner, parts):
    assert sim_kubelet.owner_parts(owner) == parts
