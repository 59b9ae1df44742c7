"""What DRA mode's steering labels count as in use (dra/labeller.py, `in_use`): every prepared
share's memory rounded up to whole units on its GPU, MIG devices by UUID; and that what pods take
waits for the rate limit's slot as what they give back does. The labeller inside the plugin,
publishing and withdrawing the labels: tests/dra/test_main.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

from dra_kit import H100, H100_B, MIG_3G

from gpuslice import config
from gpuslice.dra import labeller, shares


def share(uuid: str, memory_mib: int, mig_profile: str | None = None, gpu_uuid: str = "") -> shares.Share:
    return shares.Share("gpu", "gpu-x", None, uuid, gpu_uuid or uuid, memory_mib, mig_profile)


def test_shares_count_whole_units_on_their_gpu_a_partial_unit_taken():
    units, mig = labeller.in_use([share(H100, 2048), share(H100, 300), share(H100_B, 256)], unit_mib=256)
    assert units == {H100: 8 + 2, H100_B: 1}
    assert mig == set()


def test_a_mig_device_counts_by_its_uuid_and_takes_no_units_of_its_gpu():
    units, mig = labeller.in_use([share(MIG_3G, 40192, "3g.40gb", gpu_uuid="GPU-parent")], unit_mib=256)
    assert mig == {MIG_3G}
    assert units == {}


def test_nothing_prepared_is_nothing_in_use():
    assert labeller.in_use([], unit_mib=256) == ({}, set())


class CountingNodeApi:
    def __init__(self) -> None:
        self.patches: list[dict[str, str | None]] = []

    async def patch_labels(self, node_name: str, labels: dict[str, str | None]) -> None:
        self.patches.append(labels)

    async def until_patches(self, count: int) -> None:
        for _ in range(200):
            if len(self.patches) >= count:
                return
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def running(node, settings: config.Config, taken: Counter[str], api: CountingNodeApi):  # type: ignore[no-untyped-def]
    """A ClaimLabeller of `node` whose claims hold `taken` (units by GPU UUID), running until the block ends."""
    one = labeller.ClaimLabeller(
        lambda: (Counter(taken), set()), node=node, settings=settings, node_name="node-a", api=api
    )
    task = asyncio.create_task(one.run())
    try:
        yield one
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_what_pods_take_waits_for_the_rate_limit_slot_and_coalesces(demo_node):
    """Unlike device-plugin mode (tests/node/test_labeller.py: takes written at once), every
    write waits for the slot: the allocator decides what fits, and each Node write costs the
    scheduler a queueing-hint run per waiting pod."""
    settings = config.load(
        overrides={"steering.labelMinIntervalSeconds": 0.4, "steering.podResourcesPollSeconds": 3600}, environ={}
    )
    contract = settings.contract
    gpu = demo_node.memory_gpus[0]
    taken: Counter[str] = Counter()
    api = CountingNodeApi()
    async with running(demo_node, settings, taken, api) as one:
        await api.until_patches(1)
        assert len(api.patches) == 1  # the first state is written at once
        free = int(api.patches[0][contract.label_free_units])
        for units in (4, 8):  # two takes inside the interval
            taken[gpu.uuid] = units
            one.notify()
            await asyncio.sleep(0.05)
            assert one.desired is not None and int(one.desired[contract.label_free_units]) == free - units
            assert len(api.patches) == 1, "a take was written inside the rate limit"
        await api.until_patches(2)
        assert len(api.patches) == 2  # both takes in one write, the latest state
        assert int(api.patches[1][contract.label_free_units]) == free - 8


class HeadroomNodeApi(CountingNodeApi):
    async def headroom(self, node_name: str) -> tuple[int, int]:
        return 40_000, 200_000  # CPU millicores, memory MiB unrequested


async def test_the_cpu_balance_labels_are_published_as_in_device_plugin_mode(demo_node):
    """With steering.cpuPerGpuMilli (on by default) the node's CPU beyond what its free GPUs need:
    without these labels the webhook's CPU balance terms match no DRA node, and GPUs end up behind
    CPU that other pods took."""
    settings = config.load(overrides={"steering.cpuPerGpuMilli": 12000}, environ={})
    contract = settings.contract
    api = HeadroomNodeApi()
    async with running(demo_node, settings, Counter({demo_node.memory_gpus[0].uuid: 10**6}), api):  # GPU 0 full
        await api.until_patches(1)
    (written,) = api.patches
    free_gpus = len(demo_node.memory_gpus) - 1
    assert int(written[contract.label_spare_cpu_milli]) == 40_000 - 12_000 * free_gpus
    assert int(written[contract.label_short_cpu_milli]) == 0
    assert int(written[contract.label_free_cpu_milli]) == 40_000
    assert int(written[contract.label_cpu_per_free_gpu_milli]) == 40_000 // free_gpus  # a fallback's CPU term
