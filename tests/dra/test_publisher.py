"""ResourceSlice publishing: created once, rewritten only on change with a higher pool generation,
repaired when someone else changes or deletes them, coalesced under the rate limit, retried after
API failures, and tainted while a GPU is unhealthy."""

from __future__ import annotations

import asyncio

import dra_kit
import pytest

from gpuslice import config
from gpuslice.dra import publisher
from gpuslice.node import inventory

pytestmark = pytest.mark.usefixtures("no_leftover_tasks")


def make(node, api, unhealthy=None, **overrides) -> publisher.SlicePublisher:
    settings = config.load(overrides={f"dra.{k}": v for k, v in overrides.items()}, environ={})
    return publisher.SlicePublisher(
        node=node,
        settings=settings,
        node_name="node-a",
        api=api,
        unhealthy=(lambda: unhealthy) if unhealthy is not None else dict,
        wall_clock=lambda: "2026-11-01T10:00:00Z",
    )


async def test_the_first_sync_creates_the_slices_owned_by_the_node_and_the_next_writes_nothing(demo_node):
    api = dra_kit.FakeApi()
    slices_publisher = make(demo_node, api)
    assert await slices_publisher.sync() is True
    (obj,) = api.slices.values()
    assert obj["spec"]["pool"]["generation"] == 1
    assert obj["metadata"]["ownerReferences"][0]["uid"] == api.node_uid
    assert await slices_publisher.sync() is False
    assert api.count("create_slice") == 1 and api.count("replace_slice") == 0 and api.count("node_owner") == 1


async def test_a_health_change_rewrites_the_pool_with_a_higher_generation_and_a_taint(demo_node):
    api = dra_kit.FakeApi()
    unhealthy: dict[str, str] = {}
    slices_publisher = make(demo_node, api, unhealthy)
    await slices_publisher.sync()
    unhealthy[demo_node.gpus[0].uuid] = "XID 48"
    assert await slices_publisher.sync() is True
    (obj,) = api.slices.values()
    assert obj["spec"]["pool"]["generation"] == 2
    tainted = {d["name"]: d["taints"] for d in obj["spec"]["devices"] if d.get("taints")}
    assert tainted == {
        "gpu-0": [
            {
                "key": "gpu.gpuslice.io/unhealthy",
                "value": "XID-48",
                "effect": "NoSchedule",
                "timeAdded": "2026-11-01T10:00:00Z",
            }
        ]
    }
    unhealthy.clear()
    await slices_publisher.sync()
    (obj,) = api.slices.values()
    assert obj["spec"]["pool"]["generation"] == 3 and not any(d.get("taints") for d in obj["spec"]["devices"])


async def test_slices_deleted_or_changed_by_someone_else_are_repaired(demo_node):
    api = dra_kit.FakeApi()
    slices_publisher = make(demo_node, api)
    await slices_publisher.sync()
    name = next(iter(api.slices))
    api.slices[name]["spec"]["devices"].pop()
    assert await slices_publisher.sync() is True
    assert len(api.slices[name]["spec"]["devices"]) == 6 and api.slices[name]["spec"]["pool"]["generation"] == 2
    api.slices.clear()
    assert await slices_publisher.sync() is True and len(api.slices) == 1


async def test_slices_no_longer_wanted_are_deleted_after_the_new_ones_are_written():
    big = inventory.NodeInventory(
        gpus=tuple(
            inventory.Gpu(
                uuid=f"GPU-{i}",
                model="A100",
                memory_mib=81920,
                index=i,
                mig_enabled=True,
                mig=tuple(inventory.MigDevice(f"MIG-{i}-{j}", "1g.10gb", 9728, f"GPU-{i}") for j in range(7)),
            )
            for i in range(10)
        )
    )
    api = dra_kit.FakeApi()
    await make(big, api).sync()
    assert len(api.slices) == 2
    small = inventory.NodeInventory(gpus=big.gpus[:2])
    await make(small, api).sync()
    assert list(api.slices) == ["node-a-gpu.gpuslice.io-0"]
    assert api.slices["node-a-gpu.gpuslice.io-0"]["spec"]["pool"] == {
        "name": "node-a",
        "generation": 2,
        "resourceSliceCount": 1,
    }
    writes = [m for m, _ in api.calls if m in ("replace_slice", "delete_slice")]
    assert writes[-1] == "delete_slice"


async def test_notifications_coalesce_under_the_rate_limit_and_failures_are_retried(demo_node):
    api = dra_kit.FakeApi()
    unhealthy: dict[str, str] = {}
    slices_publisher = make(demo_node, api, unhealthy, sliceMinIntervalSeconds=0.2, sliceResyncSeconds=60)
    api.fail["list_slices"] = 1  # the first pass fails and is retried after a short backoff
    task = asyncio.create_task(slices_publisher.run(), name="publisher-under-test")
    try:
        await asyncio.wait_for(slices_publisher.synced.wait(), 5)
        assert api.count("list_slices") == 2 and slices_publisher.writes == 1
        for reason in ("XID 48", "XID 63", "XID 64", "XID 79"):  # four changes in a burst
            unhealthy[demo_node.gpus[1].uuid] = reason
            slices_publisher.notify()
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.6)
        (obj,) = api.slices.values()
        assert obj["spec"]["pool"]["generation"] == 2  # one write of the latest state
        assert [d["taints"][0]["value"] for d in obj["spec"]["devices"] if d.get("taints")] == ["XID-79"]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
