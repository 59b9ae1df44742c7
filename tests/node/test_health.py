"""XID events reach kubelet through ListAndWatch, and devices recover (fake NVML)."""

from __future__ import annotations

import types

import fake_nvml
import grpc
import pytest
from kubelet_emulator import kubelet_fixture, plugins, socket_dir_fixture  # noqa: F401 - fixtures

from gpuslice import config
from gpuslice.node import health
from gpuslice.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

pytestmark = pytest.mark.usefixtures("no_leftover_tasks")

MEMORY = "gpuslice.io/gpu-memory"
MIG_1G = "gpuslice.io/mig-1g.10gb"
H100_A = "GPU-21302f2a-76fb-5940-b684-dae50f92c162"
H100_B = "GPU-eeca949e-f642-56d1-9ca3-6efaa80acfb1"
A100 = "GPU-7a6a7324-0d4c-5ca7-b8a7-1220b7b466f9"
MIG_1G_A = "MIG-1ccf2998-6a5b-590c-8152-c9dc5eb13434"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def watched(demo_node):
    """(fake NVML, HealthState, HealthMonitor, Clock): events polled every 20 ms; recovery only
    when a test calls probe_once()."""
    nvml = fake_nvml.FakeNvml(demo_node)
    nvml.nvmlInit()
    state = health.HealthState()
    clock = Clock()
    settings = config.HealthConfig(event_timeout_ms=20, recovery_interval_seconds=3600)
    monitor = health.HealthMonitor(nvml, demo_node, settings, state, clock=clock)
    await monitor.start()
    try:
        yield nvml, state, monitor, clock
    finally:
        await monitor.stop()


async def test_a_critical_xid_marks_the_gpus_units_unhealthy_in_list_and_watch(kubelet, socket_dir, demo_node, watched):
    nvml, state, _, _ = watched
    async with plugins(demo_node, socket_dir, health_state=state):
        await kubelet.wait_for_resource(MEMORY, 636)
        nvml.inject_xid(H100_A, 79)
        await kubelet.wait_for_resource(MEMORY, 318)
        devices = kubelet.resources[MEMORY]
        assert all(d.startswith(H100_A) for d in devices.unhealthy) and len(devices.unhealthy) == 318
        assert devices.capacity == 636
        await kubelet.allocate(MEMORY, 10, "ns/p/c")
        assert all(d.startswith(H100_B) for d in kubelet.allocated("ns/p/c")[MEMORY])
        # kubelet would not offer them, but Allocate refuses unhealthy IDs on its own too
        async with grpc.aio.insecure_channel(f"unix://{socket_dir / 'gpuslice.io-gpu-memory.sock'}") as channel:
            request = api_pb2.AllocateRequest()
            request.container_requests.add(devices_ids=[f"{H100_A}::256Mi::3"])
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await api_pb2_grpc.DevicePluginStub(channel).Allocate(request)
        assert "unhealthy device ID(s)" in failure.value.details()


async def test_application_xids_are_ignored(kubelet, socket_dir, demo_node, watched):
    nvml, state, _, _ = watched
    async with plugins(demo_node, socket_dir, health_state=state):
        await kubelet.wait_for_resource(MEMORY, 636)
        for xid in config.DEFAULT_IGNORED_XIDS:
            nvml.inject_xid(H100_A, xid)
        nvml.inject_xid(H100_B, 48)  # events are handled in order: once B is down, A's were seen
        await kubelet.wait_for_resource(MEMORY, 318)
        assert state.unhealthy == {H100_B}
        assert all(d.startswith(H100_B) for d in kubelet.resources[MEMORY].unhealthy)


async def test_an_xid_on_one_mig_instance_marks_only_that_slice(kubelet, socket_dir, demo_node, watched):
    nvml, state, _, _ = watched
    async with plugins(demo_node, socket_dir, health_state=state):
        await kubelet.wait_for_resource(MIG_1G, 2)
        await kubelet.wait_for_resource("gpuslice.io/mig-3g.40gb", 1)
        await kubelet.wait_for_resource(MEMORY, 636)
        gi, ci = nvml.mig_instance(MIG_1G_A)
        nvml.inject_xid(A100, 94, gpu_instance=gi, compute_instance=ci)
        await kubelet.wait_for_resource(MIG_1G, 1)
        assert kubelet.resources[MIG_1G].unhealthy == {MIG_1G_A}
        assert kubelet.resources[MEMORY].allocatable == 636
        assert kubelet.resources["gpuslice.io/mig-3g.40gb"].allocatable == 1


async def test_an_xid_on_a_mig_gpu_itself_marks_all_its_slices(kubelet, socket_dir, demo_node, watched):
    nvml, state, _, _ = watched
    async with plugins(demo_node, socket_dir, health_state=state):
        await kubelet.wait_for_resource(MIG_1G, 2)
        await kubelet.wait_for_resource("gpuslice.io/mig-3g.40gb", 1)
        await kubelet.wait_for_resource(MEMORY, 636)
        nvml.inject_xid(A100, 79)
        await kubelet.wait_for_resource(MIG_1G, 0)
        await kubelet.wait_for_resource("gpuslice.io/mig-3g.40gb", 0)
        assert kubelet.resources[MEMORY].allocatable == 636


async def test_a_gpu_recovers_once_it_answers_nvml_again_after_a_quiet_interval(
    kubelet, socket_dir, demo_node, watched
):
    nvml, state, monitor, clock = watched
    async with plugins(demo_node, socket_dir, health_state=state):
        await kubelet.wait_for_resource(MEMORY, 636)
        nvml.fail_gpu(H100_A)
        nvml.inject_xid(H100_A, 79)
        await kubelet.wait_for_resource(MEMORY, 318)
        clock.now = 10.0
        assert await monitor.probe_once() == []  # an XID less than an interval ago
        clock.now = 4000.0
        assert await monitor.probe_once() == []  # quiet, but NVML says the GPU is lost
        nvml.recover_gpu(H100_A)
        assert await monitor.probe_once() == [H100_A]
        await kubelet.wait_for_resource(MEMORY, 636)
        assert not kubelet.resources[MEMORY].unhealthy


def test_an_event_naming_an_unknown_device_marks_the_whole_node(demo_node):
    nvml = fake_nvml.FakeNvml(demo_node)
    nvml.nvmlInit()
    state = health.HealthState()
    monitor = health.HealthMonitor(nvml, demo_node, config.HealthConfig(), state)
    event = types.SimpleNamespace(
        device=object(),
        eventType=nvml.nvmlEventTypeXidCriticalError,
        eventData=79,
        gpuInstanceId=fake_nvml.NOT_MIG_SPECIFIC,
        computeInstanceId=fake_nvml.NOT_MIG_SPECIFIC,
    )
    assert monitor.handle_event(event) == health.ALL
    assert state.is_unhealthy("GPU-anything")
    not_xid = types.SimpleNamespace(**{**vars(event), "eventType": nvml.nvmlEventTypeSingleBitEccError})
    assert monitor.handle_event(not_xid) is None


def test_configured_ignored_xids_replace_the_defaults(demo_node):
    nvml = fake_nvml.FakeNvml(demo_node)
    nvml.nvmlInit()
    state = health.HealthState()
    monitor = health.HealthMonitor(nvml, demo_node, config.HealthConfig(ignored_xids=(79,)), state)

    def event(xid: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(
            device=nvml.nvmlDeviceGetHandleByUUID(H100_B),
            eventType=nvml.nvmlEventTypeXidCriticalError,
            eventData=xid,
            gpuInstanceId=fake_nvml.NOT_MIG_SPECIFIC,
            computeInstanceId=fake_nvml.NOT_MIG_SPECIFIC,
        )

    assert monitor.handle_event(event(79)) is None
    assert monitor.handle_event(event(13)) == H100_B
    assert state.reasons[H100_B] == "XID 13"
