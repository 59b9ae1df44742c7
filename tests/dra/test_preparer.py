"""NodePrepareResources / NodeUnprepareResources logic of the DRA plugin (dra/preparer.py), without
gRPC: what a claim's containers get (the CDI spec; under migStrategy single, the MIG device),
idempotency, the GPU-capacity check, and crash-safety: a stop between any two durable steps, then a
restart, never loses nor doubles a prepared claim."""

from __future__ import annotations

import asyncio
import json
import pathlib
import subprocess
import sys

import dra_kit
import pytest
from dra_kit import H100, H100_B, MIG_3G, a100_node_file, claim, dirs_fixture, ref, result, uid  # noqa: F401 - fixture

from gpuslice import config, contract
from gpuslice.dra import checkpoint, preparer
from gpuslice.node import nodefile, startup

pytestmark = pytest.mark.usefixtures("no_leftover_tasks")


class Crash(BaseException):
    """Stands for the process dying at a step (nothing after it runs)."""


def make(node, dirs, api, settings=None, crash_at: str | None = None) -> preparer.Preparer:
    def hook(step: str) -> None:
        if step == crash_at:
            raise Crash(step)

    plugin = preparer.Preparer(
        node=node,
        settings=settings or config.Config(),
        pool="node-a",
        api=api,
        state=checkpoint.Checkpoint(dirs["state"] / "checkpoint.json", "gpu.gpuslice.io"),
        cdi_dir=dirs["cdi"],
        crash_hook=hook,
    )
    plugin.recover()
    return plugin


def spec_of(dirs, claim_uid: str) -> dict:
    return json.loads((dirs["cdi"] / f"k8s.gpu.gpuslice.io-claim_{claim_uid}.json").read_text())


def env_of(spec: dict, device: int = 0) -> dict[str, str]:
    return dict(entry.split("=", 1) for entry in spec["devices"][device]["containerEdits"]["env"])


# --- what containers get ----------------------------------------------------------------------------


async def test_a_memory_share_gets_its_gpu_and_the_share_environment(demo_node, dirs):
    api = dra_kit.FakeApi()
    share = claim(uid(1), [result("gpu", "gpu-0", "2Gi", share_id="11111111-2222-4333-8444-555555555555")])
    api.add_claim(share)
    plugin = make(demo_node, dirs, api)
    answer = (await plugin.prepare([ref(share)]))[uid(1)]
    assert answer.error == ""
    (device,) = answer.devices
    assert device.requests == ("gpu",) and device.pool == "node-a" and device.device == "gpu-0"
    assert device.share_id == "11111111-2222-4333-8444-555555555555"
    assert device.cdi_ids == (f"k8s.gpu.gpuslice.io/claim={uid(1)}-gpu",)
    spec = spec_of(dirs, uid(1))
    assert spec["cdiVersion"] == "0.5.0" and spec["kind"] == "k8s.gpu.gpuslice.io/claim"
    assert spec["devices"][0]["name"] == f"{uid(1)}-gpu"
    assert env_of(spec) == {
        "NVIDIA_VISIBLE_DEVICES": H100,
        "GPUSLICE_MEMORY_LIMIT_MIB": "2048",
        "GPUSLICE_GPU_FRACTION": "0.0251",  # 8 of 318 units
        "GPUSLICE_GPU_COUNT": "1",
        "GPU_PORTION": "0.0251",
    }


async def test_a_share_allocated_before_the_capacity_was_qualified_keeps_its_memory(demo_node, dirs):
    # Allocated by a scheduler when the slice still named the capacity plain `memory`: still a
    # 2 GiB share, not the whole GPU (the fallback for a claim's result without consumed memory).
    api = dra_kit.FakeApi()
    old = result("gpu", "gpu-0", "2Gi", share_id="11111111-2222-4333-8444-555555555555", capacity="memory")
    share = claim(uid(1), [old])
    api.add_claim(share)
    answer = (await make(demo_node, dirs, api).prepare([ref(share)]))[uid(1)]
    assert answer.error == ""
    assert env_of(spec_of(dirs, uid(1)))["GPUSLICE_MEMORY_LIMIT_MIB"] == "2048"


async def test_with_mps_the_share_gets_its_memory_and_sm_limits_and_the_pipe(demo_node, dirs):
    api = dra_kit.FakeApi()
    half = claim(uid(2), [result("gpu", "gpu-1", "40704Mi", share_id="aaaaaaaa-2222-4333-8444-555555555555")])
    api.add_claim(half)
    settings = config.load(overrides={"mps.enabled": True}, environ={})
    plugin = make(demo_node, dirs, api, settings)
    assert (await plugin.prepare([ref(half)]))[uid(2)].error == ""
    spec = spec_of(dirs, uid(2))
    env = env_of(spec)
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=40704M"  # the only GPU the container sees
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia/mps/pipe"
    assert env["GPUSLICE_MEMORY_LIMIT_MIB"] == "40704" and env["GPU_PORTION"] == "0.5"
    # The MPS pipe and the daemon's shared /dev/shm, as in device-plugin mode (node/response.py).
    assert sorted(spec["devices"][0]["containerEdits"]["mounts"], key=lambda m: m["containerPath"]) == [
        {"hostPath": "/run/nvidia/mps/shm", "containerPath": "/dev/shm", "options": ["rw", "nosuid", "nodev", "bind"]},
        {
            "hostPath": "/run/nvidia/mps/pipe",
            "containerPath": "/run/nvidia/mps/pipe",
            "options": ["rw", "nosuid", "nodev", "bind"],
        },
    ]


async def test_whole_gpus_of_one_request_share_one_environment_on_the_first_device(demo_node, dirs):
    api = dra_kit.FakeApi()
    two = claim(uid(3), [result("gpus", "gpu-0"), result("gpus", "gpu-1")])  # no consumedCapacity: exclusive
    api.add_claim(two)
    devices = (await make(demo_node, dirs, api).prepare([ref(two)]))[uid(3)].devices
    assert [d.device for d in devices] == ["gpu-0", "gpu-1"]
    assert devices[0].cdi_ids == (f"k8s.gpu.gpuslice.io/claim={uid(3)}-gpus",) and devices[1].cdi_ids == ()
    env = env_of(spec_of(dirs, uid(3)))
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"{H100},{H100_B}"
    assert env["GPUSLICE_GPU_COUNT"] == "2" and env["GPU_PORTION"] == "1"
    assert env["GPUSLICE_MEMORY_LIMIT_MIB"] == "81408"


async def test_a_whole_gpu_taken_by_its_tag_gets_the_whole_gpu_environment(demo_node, dirs):
    # As the real allocator records it (tests/e2e/test_real_dra.py): the memory's default and every
    # capacity of the device, the tag asked at 1, the other at 0.
    api = dra_kit.FakeApi()
    consumed = {
        f"{dra_kit.DRIVER}/memory": "81408Mi",
        f"{dra_kit.DRIVER}/whole": "1",
        f"{dra_kit.DRIVER}/m81559": "0",
    }
    whole = claim(uid(4), [{**result("gpu/any", "gpu-1"), "consumedCapacity": consumed}])
    api.add_claim(whole)
    (device,) = (await make(demo_node, dirs, api).prepare([ref(whole)]))[uid(4)].devices
    assert device.device == "gpu-1"
    env = env_of(spec_of(dirs, uid(4)))
    assert env["NVIDIA_VISIBLE_DEVICES"] == H100_B and env["GPU_PORTION"] == "1"
    assert env["GPUSLICE_MEMORY_LIMIT_MIB"] == "81408"


def halves(n: int) -> dict:
    """A claim of gpu-fraction 0.5 with gpu-fraction-num-devices 2: one request, a half of each H100."""
    return claim(
        uid(n),
        [
            result("gpu", "gpu-0", "40704Mi", share_id=f"{n:08x}-0000-4000-8000-00000000000a"),
            result("gpu", "gpu-1", "40704Mi", share_id=f"{n:08x}-0000-4000-8000-00000000000b"),
        ],
    )


async def test_a_share_of_each_of_two_gpus_gets_both_in_one_environment_with_a_limit_on_each(demo_node, dirs):
    api = dra_kit.FakeApi()
    pair = halves(40)
    api.add_claim(pair)
    settings = config.load(overrides={"mps.enabled": True}, environ={})
    devices = (await make(demo_node, dirs, api, settings).prepare([ref(pair)]))[uid(40)].devices
    # Kubelet tells the two shares apart by their share IDs; the runtime gets the request's CDI device once.
    assert [(d.device, d.share_id) for d in devices] == [
        ("gpu-0", "00000028-0000-4000-8000-00000000000a"),
        ("gpu-1", "00000028-0000-4000-8000-00000000000b"),
    ]
    assert devices[0].cdi_ids == (f"k8s.gpu.gpuslice.io/claim={uid(40)}-gpu",) and devices[1].cdi_ids == ()
    spec = spec_of(dirs, uid(40))
    assert len(spec["devices"]) == 1  # one device: two would each set NVIDIA_VISIBLE_DEVICES, the last one winning
    env = env_of(spec)
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"{H100},{H100_B}" and env["GPUSLICE_GPU_COUNT"] == "2"
    assert env["GPUSLICE_MEMORY_LIMIT_MIB"] == "40704" and env["GPU_PORTION"] == "0.5"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=40704M,1=40704M"  # half of each GPU the container sees


async def test_shares_on_several_gpus_count_against_each_gpu(demo_node, dirs):
    api = dra_kit.FakeApi()
    first, second, third = halves(41), halves(42), halves(43)
    for obj in (first, second, third):
        api.add_claim(obj)
    plugin = make(demo_node, dirs, api)
    assert (await plugin.prepare([ref(first)]))[uid(41)].error == ""
    assert (await plugin.prepare([ref(second)]))[uid(42)].error == ""  # both H100s now full
    refused = (await plugin.prepare([ref(third)]))[uid(43)].error
    assert "GPU gpu-0" in refused and "would hold 122112 MiB of shares, more than its 81408 MiB" in refused
    await plugin.unprepare([ref(first)])
    assert (await plugin.prepare([ref(third)]))[uid(43)].error == ""


async def test_a_mig_device_gets_its_slice_without_mps_limits(demo_node, dirs):
    api = dra_kit.FakeApi()
    mig = claim(uid(4), [result("mig", "gpu-2-mig-0")])
    api.add_claim(mig)
    settings = config.load(overrides={"mps.enabled": True}, environ={})
    assert (await make(demo_node, dirs, api, settings).prepare([ref(mig)]))[uid(4)].error == ""
    env = env_of(spec_of(dirs, uid(4)))
    assert env == {"NVIDIA_VISIBLE_DEVICES": MIG_3G, "GPUSLICE_MEMORY_LIMIT_MIB": "40192", "GPUSLICE_GPU_COUNT": "1"}


@pytest.mark.parametrize(
    ("allocated", "env"),
    [
        (
            result("gpu/mig", "gpu-2-mig-0"),
            {"NVIDIA_VISIBLE_DEVICES": MIG_3G, "GPUSLICE_MEMORY_LIMIT_MIB": "40192", "GPUSLICE_GPU_COUNT": "1"},
        ),
        (
            result("gpu/share", "gpu-0", "40192Mi", share_id="cccccccc-2222-4333-8444-555555555555"),
            {"NVIDIA_VISIBLE_DEVICES": H100, "GPUSLICE_MEMORY_LIMIT_MIB": "40192", "GPUSLICE_GPU_COUNT": "1"},
        ),
    ],
    ids=["mig-taken", "share-taken"],
)
async def test_a_prioritized_list_result_is_prepared_under_its_request_whichever_subrequest_was_taken(
    demo_node, dirs, allocated, env
):
    """The scheduler names a firstAvailable result "<request>/<subrequest>" (mig-or-share: "gpu/mig" or
    "gpu/share"); containers reference the request, so the CDI device and the answer carry "gpu" either way."""
    api = dra_kit.FakeApi()
    either = claim(uid(6), [allocated])
    api.add_claim(either)
    (device,) = (await make(demo_node, dirs, api).prepare([ref(either)]))[uid(6)].devices
    assert device.requests == ("gpu",) and device.device == allocated["device"]
    assert device.share_id == allocated.get("shareID")
    assert device.cdi_ids == (f"k8s.gpu.gpuslice.io/claim={uid(6)}-gpu",)
    spec = spec_of(dirs, uid(6))
    assert [d["name"] for d in spec["devices"]] == [f"{uid(6)}-gpu"]
    assert {k: v for k, v in env_of(spec).items() if k in env} == env


async def test_cdi_cri_adds_the_toolkits_device_beside_the_claims_own(demo_node, dirs):
    api = dra_kit.FakeApi()
    share = claim(uid(5), [result("gpu", "gpu-0", "1Gi", share_id="bbbbbbbb-2222-4333-8444-555555555555")])
    api.add_claim(share)
    settings = config.load(overrides={"deviceListStrategy": "cdi-cri"}, environ={})
    (device,) = (await make(demo_node, dirs, api, settings).prepare([ref(share)]))[uid(5)].devices
    assert device.cdi_ids == (f"k8s.gpu.gpuslice.io/claim={uid(5)}-gpu", f"nvidia.com/gpu={H100}")
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(spec_of(dirs, uid(5)))


async def test_other_drivers_and_other_nodes_results_are_left_to_them(demo_node, dirs):
    api = dra_kit.FakeApi()
    mixed = claim(
        uid(6),
        [
            result("nic", "eth0", driver="net.example.com"),
            {**result("gpu", "gpu-0", "1Gi"), "pool": "node-b"},
            result("gpu", "gpu-1", "1Gi"),
        ],
    )
    api.add_claim(mixed)
    devices = (await make(demo_node, dirs, api).prepare([ref(mixed)]))[uid(6)].devices
    assert [(d.pool, d.device) for d in devices] == [("node-a", "gpu-1")]


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (claim(uid(7), None), "is not allocated"),
        (claim(uid(7), [result("gpu", "gpu-9", "1Gi")]), "device 'gpu-9' of pool 'node-a' is not on this node"),
        (claim(uid(7), [result("gpu", "gpu-0", "lots")]), "is not a quantity"),
        (claim(uid(7), [result("x", "eth0", driver="net.example.com")]), "has no device of driver gpu.gpuslice.io"),
        (claim(uid(7), [result("g", "gpu-0"), result("g", "gpu-2-mig-0")]), "mixes MIG devices and shared GPUs"),
    ],
    ids=["unallocated", "unknown-device", "bad-quantity", "no-device-of-ours", "mixed-request"],
)
async def test_claims_that_cannot_be_prepared_get_an_error_naming_why(demo_node, dirs, obj, message):
    api = dra_kit.FakeApi()
    api.add_claim(obj)
    answer = (await make(demo_node, dirs, api).prepare([ref(obj)]))[uid(7)]
    assert message in answer.error and answer.devices == ()
    assert list(dirs["cdi"].glob("*.json")) == []


async def test_a_missing_claim_or_a_reused_name_is_refused(demo_node, dirs):
    api = dra_kit.FakeApi()
    plugin = make(demo_node, dirs, api)
    ghost = claim(uid(8), [result("gpu", "gpu-0", "1Gi")])
    assert "was not found in the API server" in (await plugin.prepare([ref(ghost)]))[uid(8)].error
    api.add_claim(claim(uid(9), [result("gpu", "gpu-0", "1Gi")], name=ghost["metadata"]["name"]))
    assert f"with UID {uid(9)}, not {uid(8)}" in (await plugin.prepare([ref(ghost)]))[uid(8)].error


async def test_api_failures_become_claim_errors_kubelet_retries(demo_node, dirs):
    api = dra_kit.FakeApi()
    share = claim(uid(10), [result("gpu", "gpu-0", "1Gi")])
    api.add_claim(share)
    api.fail["get_claim"] = 1
    plugin = make(demo_node, dirs, api)
    assert "503" in (await plugin.prepare([ref(share)]))[uid(10)].error
    assert (await plugin.prepare([ref(share)]))[uid(10)].error == ""


# --- idempotency and the capacity check ------------------------------------------------------------


async def test_preparing_again_answers_the_same_without_asking_the_api_server(demo_node, dirs):
    api = dra_kit.FakeApi()
    share = claim(uid(11), [result("gpu", "gpu-0", "3Gi", share_id="cccccccc-2222-4333-8444-555555555555")])
    api.add_claim(share)
    plugin = make(demo_node, dirs, api)
    first = await plugin.prepare([ref(share)])
    second = await plugin.prepare([ref(share)])
    assert first == second and api.count("get_claim") == 1
    assert len(list(dirs["cdi"].glob("*.json"))) == 1


async def test_concurrent_prepares_of_one_claim_prepare_it_once(demo_node, dirs):
    api = dra_kit.FakeApi()
    share = claim(uid(12), [result("gpu", "gpu-0", "3Gi")])
    api.add_claim(share)
    plugin = make(demo_node, dirs, api)
    answers = await asyncio.gather(*(plugin.prepare([ref(share)]) for _ in range(5)))
    assert all(a == answers[0] for a in answers) and api.count("get_claim") == 1
    assert list(plugin.checkpoint.claims) == [uid(12)]
    assert plugin._claim_locks == {}


async def test_unprepare_removes_spec_and_record_and_is_idempotent(demo_node, dirs):
    api = dra_kit.FakeApi()
    share = claim(uid(13), [result("gpu", "gpu-0", "1Gi")])
    api.add_claim(share)
    plugin = make(demo_node, dirs, api)
    await plugin.prepare([ref(share)])
    assert await plugin.unprepare([ref(share)]) == {uid(13): ""}
    assert list(dirs["cdi"].glob("*.json")) == [] and plugin.checkpoint.claims == {}
    assert await plugin.unprepare([ref(share)]) == {uid(13): ""}
    assert await plugin.unprepare([ref(claim(uid(14), None))]) == {uid(14): ""}


async def test_shares_beyond_a_gpus_memory_wait_for_earlier_claims_to_be_unprepared(demo_node, dirs):
    api = dra_kit.FakeApi()
    big = claim(uid(15), [result("gpu", "gpu-0", "60Gi")])
    late = claim(uid(16), [result("gpu", "gpu-0", "20Gi")])  # 80 GiB > 81408 MiB: a stale share overlaps
    fits = claim(uid(17), [result("gpu", "gpu-0", "19Gi")])
    for obj in (big, late, fits):
        api.add_claim(obj)
    plugin = make(demo_node, dirs, api)
    await plugin.prepare([ref(big)])
    refused = (await plugin.prepare([ref(late)]))[uid(16)].error
    assert "would hold 81920 MiB of shares, more than its 81408 MiB" in refused
    assert (await plugin.prepare([ref(fits)]))[uid(17)].error == ""
    await plugin.unprepare([ref(big)])
    assert (await plugin.prepare([ref(late)]))[uid(16)].error == ""


async def test_a_mig_device_is_never_prepared_for_two_claims(demo_node, dirs):
    api = dra_kit.FakeApi()
    one, two = claim(uid(18), [result("m", "gpu-2-mig-1")]), claim(uid(19), [result("m", "gpu-2-mig-1")])
    api.add_claim(one)
    api.add_claim(two)
    plugin = make(demo_node, dirs, api)
    await plugin.prepare([ref(one)])
    assert "already prepared for another claim" in (await plugin.prepare([ref(two)]))[uid(19)].error


# --- crash-safety ------------------------------------------------------------------------------------


@pytest.mark.parametrize("step", ["started", "cdi-written"])
async def test_a_prepare_stopped_at_any_step_is_finished_once_after_a_restart(demo_node, dirs, step):
    api = dra_kit.FakeApi()
    share = claim(uid(20), [result("gpu", "gpu-0", "8Gi", share_id="dddddddd-2222-4333-8444-555555555555")])
    api.add_claim(share)
    with pytest.raises(Crash):
        await make(demo_node, dirs, api, crash_at=step).prepare([ref(share)])
    restarted = make(demo_node, dirs, api)
    assert restarted.checkpoint.claims[uid(20)].state == checkpoint.STARTED  # remembered, not finished
    # Its share still counts: a claim that would overlap it is refused.
    rival = claim(uid(21), [result("gpu", "gpu-0", "75Gi")])
    api.add_claim(rival)
    assert "more than its" in (await restarted.prepare([ref(rival)]))[uid(21)].error
    answer = (await restarted.prepare([ref(share)]))[uid(20)]
    assert answer.error == "" and restarted.checkpoint.claims[uid(20)].state == checkpoint.COMPLETED
    assert [p.name for p in dirs["cdi"].glob("*.json")] == [f"k8s.gpu.gpuslice.io-claim_{uid(20)}.json"]
    assert list(restarted.checkpoint.claims) == [uid(20)]


async def test_an_interrupted_prepare_can_be_unprepared_after_a_restart(demo_node, dirs):
    api = dra_kit.FakeApi()
    share = claim(uid(22), [result("gpu", "gpu-1", "8Gi")])
    api.add_claim(share)
    with pytest.raises(Crash):
        await make(demo_node, dirs, api, crash_at="cdi-written").prepare([ref(share)])
    restarted = make(demo_node, dirs, api)
    assert await restarted.unprepare([ref(share)]) == {uid(22): ""}
    assert restarted.checkpoint.claims == {} and list(dirs["cdi"].glob("*.json")) == []


async def test_an_unprepare_stopped_after_removing_the_spec_finishes_after_a_restart(demo_node, dirs):
    api = dra_kit.FakeApi()
    share = claim(uid(23), [result("gpu", "gpu-0", "8Gi")])
    api.add_claim(share)
    await make(demo_node, dirs, api).prepare([ref(share)])
    with pytest.raises(Crash):
        await make(demo_node, dirs, api, crash_at="cdi-removed").unprepare([ref(share)])
    restarted = make(demo_node, dirs, api)
    assert uid(23) in restarted.checkpoint.claims and list(dirs["cdi"].glob("*.json")) == []
    assert await restarted.unprepare([ref(share)]) == {uid(23): ""}
    assert restarted.checkpoint.claims == {}


async def test_a_restart_removes_cdi_specs_no_record_claims(demo_node, dirs):
    api = dra_kit.FakeApi()
    share = claim(uid(24), [result("gpu", "gpu-0", "8Gi")])
    api.add_claim(share)
    await make(demo_node, dirs, api).prepare([ref(share)])
    orphan = dirs["cdi"] / f"k8s.gpu.gpuslice.io-claim_{uid(25)}.json"
    orphan.write_text("{}")
    foreign = dirs["cdi"] / "nvidia.com-gpu.yaml"
    foreign.write_text("cdiVersion: 0.5.0")
    restarted = make(demo_node, dirs, api)
    assert not orphan.exists() and foreign.exists()
    assert (dirs["cdi"] / f"k8s.gpu.gpuslice.io-claim_{uid(24)}.json").exists()
    assert list(restarted.checkpoint.claims) == [uid(24)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "is damaged"),
        ('{"version": "gpuslice.dra/v9", "driver": "gpu.gpuslice.io", "claims": {}}', "version"),
        ('{"version": "gpuslice.dra/v1", "driver": "other.io", "sha256": "", "claims": {}}', "belongs to driver"),
        (
            '{"version": "gpuslice.dra/v1", "driver": "gpu.gpuslice.io", "sha256": "0", "claims": {}}',
            "checksum mismatch",
        ),
    ],
    ids=["not-json", "future-version", "other-driver", "edited"],
)
async def test_a_checkpoint_that_cannot_be_trusted_stops_the_plugin_with_a_reason(demo_node, dirs, text, message):
    dirs["state"].mkdir(parents=True)
    (dirs["state"] / "checkpoint.json").write_text(text)
    with pytest.raises(checkpoint.CheckpointError, match=message):
        make(demo_node, dirs, dra_kit.FakeApi())


# --- a real process killed between steps --------------------------------------------------------------

CRASHER = r"""
import asyncio, os, sys
sys.path.insert(0, sys.argv[1])
import dra_kit
from gpuslice import config
from gpuslice.node import nodefile
from gpuslice.dra import checkpoint, preparer
root, step = sys.argv[2], sys.argv[3]
api = dra_kit.FakeApi()
obj = dra_kit.claim(dra_kit.uid(30), [dra_kit.result("gpu", "gpu-0", "4Gi")])
api.add_claim(obj)
def hook(at):
    if at == step:
        os._exit(137)  # as SIGKILL would: no cleanup, no flush
plugin = preparer.Preparer(
    node=nodefile.load(sys.argv[4]), settings=config.Config(), pool="node-a", api=api,
    state=checkpoint.Checkpoint(os.path.join(root, "state", "checkpoint.json"), "gpu.gpuslice.io"),
    cdi_dir=os.path.join(root, "cdi"), crash_hook=hook)
plugin.recover()
print(asyncio.run(plugin.prepare([dra_kit.ref(obj)])))
"""


@pytest.mark.parametrize("step", ["started", "cdi-written"])
async def test_a_plugin_process_killed_mid_prepare_loses_and_doubles_nothing(demo_node, dirs, step):
    tests_dir = pathlib.Path(__file__).parents[1]  # where dra_kit is
    node_file = tests_dir.parent / "gpuslice" / "examples" / "demo-node.yaml"
    done = subprocess.run(
        [sys.executable, "-c", CRASHER, str(tests_dir), str(dirs["root"]), step, str(node_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 137, done.stderr
    api = dra_kit.FakeApi()
    obj = claim(uid(30), [result("gpu", "gpu-0", "4Gi")])
    api.add_claim(obj)
    restarted = make(demo_node, dirs, api)
    assert restarted.checkpoint.claims[uid(30)].state == checkpoint.STARTED
    assert (await restarted.prepare([ref(obj)]))[uid(30)].error == ""
    assert len(list(dirs["cdi"].glob("*.json"))) == 1
    assert [s.memory_mib for s in restarted.prepared_shares()] == [4096]


# --- migStrategy single -------------------------------------------------------------------------------


async def test_under_single_a_share_is_prepared_on_its_mig_device(tmp_path, dirs):
    settings = config.Config(mig_strategy="single")
    served = startup.served_node(nodefile.load(a100_node_file(tmp_path)), settings)
    api = dra_kit.FakeApi()
    share = claim(uid(1), [result("gpu", "gpu-3", "10Gi", share_id="11111111-2222-4333-8444-555555555555")])
    api.add_claim(share)
    plugin = preparer.Preparer(
        node=served,
        settings=settings,
        pool="node-a",
        api=api,
        state=checkpoint.Checkpoint(dirs["state"] / "checkpoint.json", contract.Contract().dra_driver),
        cdi_dir=dirs["cdi"],
    )
    plugin.recover()
    assert (await plugin.prepare([ref(share)]))[uid(1)].error == ""
    spec = json.loads((dirs["cdi"] / f"k8s.gpu.gpuslice.io-claim_{uid(1)}.json").read_text())
    env = dict(entry.split("=", 1) for entry in spec["devices"][0]["containerEdits"]["env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "MIG-00010001-0000-0000-0000-000000000000"
    assert env["GPUSLICE_MEMORY_LIMIT_MIB"] == "10240"
    assert env["GPUSLICE_GPU_FRACTION"] == "0.2547"  # 40 of the MIG device's 157 units
