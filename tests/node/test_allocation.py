"""Allocation through the real v1beta1 gRPC API: kubelet emulator -> plugin sockets."""

from __future__ import annotations

import grpc
import pytest
from kubelet_emulator import AdmissionError, kubelet_fixture, plugins, socket_dir_fixture  # noqa: F401 - fixtures

from gpuslice import config, contract
from gpuslice.node import allocation, nodefile
from gpuslice.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

pytestmark = pytest.mark.usefixtures("no_leftover_tasks")

MEMORY = "gpuslice.io/gpu-memory"
H100_A = "GPU-21302f2a-76fb-5940-b684-dae50f92c162"
H100_B = "GPU-eeca949e-f642-56d1-9ca3-6efaa80acfb1"
UNITS_PER_H100 = 81559 // 256  # 318


def gpus_of(kubelet, owner: str) -> set[str]:
    return {contract.parse_unit_device_id(d).gpu_uuid for d in kubelet.allocated(owner)[MEMORY]}


async def test_shares_are_packed_best_fit_one_gpu_each(kubelet, socket_dir, demo_node):
    async with plugins(demo_node, socket_dir):
        await kubelet.wait_for_resource(MEMORY, 2 * UNITS_PER_H100)
        # (owner, units, GPU expected): tightest fit wins, lowest index on ties
        plan = [
            ("ns/a/c", 100, H100_A),
            ("ns/b/c", 50, H100_A),
            ("ns/c/c", 250, H100_B),
            ("ns/d/c", 150, H100_A),
            ("ns/e/c", 60, H100_B),
        ]
        for owner, units, expected in plan:
            answer = await kubelet.allocate(MEMORY, units, owner)
            envs = answer.container_responses[0].envs
            assert gpus_of(kubelet, owner) == {expected}, owner
            assert envs["NVIDIA_VISIBLE_DEVICES"] == expected
            assert envs["GPUSLICE_MEMORY_LIMIT_MIB"] == str(units * 256)
            assert envs["GPUSLICE_GPU_COUNT"] == "1"
        assert len(kubelet.resources[MEMORY].available()) == 2 * UNITS_PER_H100 - 610


async def test_a_request_of_whole_gpus_gets_fully_free_gpus(kubelet, socket_dir, demo_node):
    async with plugins(demo_node, socket_dir):
        await kubelet.wait_for_resource(MEMORY, 2 * UNITS_PER_H100)
        answer = await kubelet.allocate(MEMORY, 2 * UNITS_PER_H100, "ns/train/c")
        envs = answer.container_responses[0].envs
        assert set(envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == {H100_A, H100_B}
        assert (envs["GPUSLICE_GPU_FRACTION"], envs["GPUSLICE_GPU_COUNT"], envs["GPU_PORTION"]) == ("1", "2", "1")


def four_gpus_with_one_nvlinked_pair():
    gpus = []
    for i in range(4):
        links = {"GPU-3": 18} if i == 1 else {"GPU-1": 18} if i == 3 else {"GPU-2": 2} if i == 0 else {}
        gpus.append({"uuid": f"GPU-{i}", "model": "NVIDIA H100", "memoryMiB": 1024, "index": i, "nvlinks": links})
    return nodefile.parse({"gpus": gpus})


async def test_whole_gpus_prefer_the_set_best_connected_by_nvlink(kubelet, socket_dir):
    async with plugins(four_gpus_with_one_nvlinked_pair(), socket_dir):
        await kubelet.wait_for_resource(MEMORY, 16)
        await kubelet.allocate(MEMORY, 8, "ns/pair/c")
        assert gpus_of(kubelet, "ns/pair/c") == {"GPU-1", "GPU-3"}
        await kubelet.allocate(MEMORY, 8, "ns/rest/c")
        assert gpus_of(kubelet, "ns/rest/c") == {"GPU-0", "GPU-2"}


async def test_mig_slices_are_their_own_resources(kubelet, socket_dir, demo_node):
    async with plugins(demo_node, socket_dir):
        await kubelet.wait_for_resource("gpuslice.io/mig-1g.10gb", 2)
        await kubelet.wait_for_resource("gpuslice.io/mig-3g.40gb", 1)
        answer = await kubelet.allocate("gpuslice.io/mig-1g.10gb", 1, "ns/small/c")
        envs = answer.container_responses[0].envs
        assert envs["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
        assert envs["GPUSLICE_MEMORY_LIMIT_MIB"] == "9728"
        assert kubelet.allocated("ns/small/c")["gpuslice.io/mig-1g.10gb"] == (envs["NVIDIA_VISIBLE_DEVICES"],)
        with pytest.raises(AdmissionError, match="Requested: 2, Available: 1"):
            await kubelet.allocate("gpuslice.io/mig-1g.10gb", 2, "ns/big/c")


async def test_allocate_refuses_a_mig_device_requested_twice(kubelet, socket_dir, demo_node):
    resource = "gpuslice.io/mig-1g.10gb"
    async with plugins(demo_node, socket_dir):
        await kubelet.wait_for_resource(resource, 2)
        channel, stub = await plugin_stub(socket_dir, resource.replace("/", "-") + ".sock")
        async with channel:
            twice = kubelet.resources[resource].available()[:1] * 2
            request = api_pb2.AllocateRequest()
            request.container_requests.add(devices_ids=twice)
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await stub.Allocate(request)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "requested twice" in failure.value.details()


async def test_a_share_that_fits_on_no_single_gpu_is_rejected_with_the_reason(kubelet, socket_dir, demo_node):
    async with plugins(demo_node, socket_dir):
        await kubelet.wait_for_resource(MEMORY, 2 * UNITS_PER_H100)
        await kubelet.allocate(MEMORY, 100, "ns/a/c")  # GPU A: 218 free
        await kubelet.allocate(MEMORY, 200, "ns/b/c")  # best fit, GPU A: 18 free
        await kubelet.allocate(MEMORY, 200, "ns/c/c")  # GPU B: 118 free
        with pytest.raises(AdmissionError) as failure:  # 136 free units, but 130 fit on neither GPU
            await kubelet.allocate(MEMORY, 130, "ns/d/c")
        message = str(failure.value)
        assert "code = INVALID_ARGUMENT" in message
        assert "130 gpu-memory units span 2 GPUs" in message and "must fit on one GPU" in message
        assert "ns/d/c" not in kubelet.resources[MEMORY].allocated


async def plugin_stub(socket_dir, name="gpuslice.io-gpu-memory.sock"):
    channel = grpc.aio.insecure_channel(f"unix://{socket_dir / name}")
    return channel, api_pb2_grpc.DevicePluginStub(channel)


@pytest.mark.parametrize(
    ("device_ids", "message"),
    [
        (["GPU-nope::1"], "unknown device ID(s) GPU-nope::1"),
        ([f"{H100_A}::256Mi::0", f"{H100_A}::256Mi::0"], "requested twice"),
        ([f"{H100_A}::256Mi::0", f"{H100_B}::256Mi::0"], "2 gpu-memory units span 2 GPUs"),
        ([], "no gpu-memory devices"),
    ],
    ids=["unknown-id", "duplicate-id", "cross-gpu", "empty"],
)
async def test_allocate_rejects_bad_device_lists_with_a_message(socket_dir, kubelet, demo_node, device_ids, message):
    async with plugins(demo_node, socket_dir):
        await kubelet.wait_for_resource(MEMORY)
        channel, stub = await plugin_stub(socket_dir)
        async with channel:
            request = api_pb2.AllocateRequest()
            request.container_requests.add(devices_ids=[f"{H100_B}::256Mi::5"])  # fine, but the next one is not
            request.container_requests.add(devices_ids=device_ids)
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await stub.Allocate(request)
        assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in failure.value.details()
        assert failure.value.details().startswith(MEMORY)


async def test_preferred_allocation_honours_must_include(socket_dir, kubelet, demo_node):
    async with plugins(demo_node, socket_dir):
        await kubelet.wait_for_resource(MEMORY)
        channel, stub = await plugin_stub(socket_dir)
        async with channel:
            request = api_pb2.PreferredAllocationRequest()
            available = kubelet.resources[MEMORY].available()
            request.container_requests.add(
                available_deviceIDs=available, must_include_deviceIDs=[f"{H100_B}::256Mi::7"], allocation_size=4
            )
            answer = await stub.GetPreferredAllocation(request)
        chosen = list(answer.container_responses[0].deviceIDs)
        assert len(chosen) == 4 and f"{H100_B}::256Mi::7" in chosen
        assert {contract.parse_unit_device_id(d).gpu_uuid for d in chosen} == {H100_B}


# --- what the container gets ---------------------------------------------------------------


async def test_mps_limits_reach_the_container_through_allocate(kubelet, socket_dir, demo_node):
    settings = config.load(environ={}, overrides={"mps.enabled": True, "deviceListStrategy": "cdi-cri"})
    async with plugins(demo_node, socket_dir, settings=settings):
        await kubelet.wait_for_resource(MEMORY)
        answer = (await kubelet.allocate(MEMORY, 80, "ns/mps/c")).container_responses[0]
        assert answer.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={80 * 256}M"  # the container's device 0
        assert answer.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(round(80 / 318 * 100))
        assert [d.name for d in answer.cdi_devices] == [f"nvidia.com/gpu={H100_A}"]
        assert answer.mounts[0].host_path == settings.mps.pipe_directory
        assert (answer.mounts[1].container_path, answer.mounts[1].host_path) == ("/dev/shm", settings.mps.shm_directory)
        kubelet.release("ns/mps/c")
        whole = (await kubelet.allocate(MEMORY, 2 * 318, "ns/mps/whole")).container_responses[0]
        assert whole.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={318 * 256}M,1={318 * 256}M"


# --- the policy itself, on the plain functions the simulator calls too ------------------------


@pytest.fixture
def units(demo_node):
    return allocation.MemoryUnits(demo_node, 256)


def ids(gpu: str, *indexes: int) -> list[str]:
    return [contract.unit_device_id(gpu, i, 256) for i in indexes]


@pytest.mark.parametrize(
    ("free", "must", "size", "expected"),
    [
        # best fit: B has fewer free units that still hold the request
        ((range(318), range(300, 318)), (), 10, ("B", range(300, 310))),
        # must_include pins the GPU even when another fits tighter
        ((range(318), range(300, 318)), ("A", 5), 3, ("A", [5, 0, 1])),
        # nothing fits on one GPU: the answer still has `size` IDs, most-free GPU first
        ((range(10), range(8)), (), 12, ("A+B", None)),
        # unknown IDs in available are ignored
        ((range(4), ()), (), 2, ("A", [0, 1])),
    ],
    ids=["best-fit", "must-include", "spill", "unknown-ignored"],
)
def test_preferred_units_follow_the_policy(units, free, must, size, expected):
    available = ids(H100_A, *free[0]) + ids(H100_B, *free[1]) + ["GPU-stranger::1"]
    must_include = ids(H100_A if must[0] == "A" else H100_B, must[1]) if must else []
    chosen = units.preferred(list(reversed(available)), must_include, size)
    gpu, indexes = expected
    assert len(chosen) == size
    if gpu == "A+B":
        assert chosen == ids(H100_A, *range(10)) + ids(H100_B, 0, 1)
    else:
        assert chosen == ids(H100_A if gpu == "A" else H100_B, *indexes)


def test_whole_gpu_requests_with_must_include_keep_that_gpu(units):
    everything = list(units.device_ids)
    chosen = units.preferred(everything, ids(H100_B, 9), 318)
    assert chosen == ids(H100_B, *range(318))
    assert units.preferred(everything, [], 636) == ids(H100_A, *range(318)) + ids(H100_B, *range(318))
