"""The start-up check that a change of memoryUnitMiB never lets kubelet promise a GPU's memory
twice (issue 13.3; node/startup.py): which units pods hold are of another size, and kubelet's
PodResources socket missing or never answering. The plugin refusing to start over them:
tests/deviceplugin/test_main_unitsize.py."""

from __future__ import annotations

import pytest

from gpuslice import contract
from gpuslice.node import podresources, startup

pytestmark = pytest.mark.usefixtures("no_leftover_tasks")

MEMORY = "gpuslice.io/gpu-memory"
H100_A = "GPU-21302f2a-76fb-5940-b684-dae50f92c162"
H100_B = "GPU-eeca949e-f642-56d1-9ca3-6efaa80acfb1"
H100_MIB = 81559


def held(*entries: tuple[str, tuple[str, ...]]) -> list[podresources.ContainerDevices]:
    return [podresources.ContainerDevices("ns", pod, "c", MEMORY, ids) for pod, ids in entries]


def test_units_of_another_size_or_without_a_size_are_foreign_and_others_are_not(demo_node):
    names = contract.Contract(unit_mib=128)
    ours = frozenset(names.unit_device_id(H100_A, i) for i in range(H100_MIB // 128))
    holdings = held(
        ("mine", (names.unit_device_id(H100_A, 3),)),
        ("old", (contract.unit_device_id(H100_A, 0, 256), contract.unit_device_id(H100_A, 1, 256))),
        ("legacy", (f"{H100_B}::7",)),  # gpuslice 0.1: no size in the ID
        ("elsewhere", (contract.unit_device_id("GPU-not-on-this-node", 0, 256), "garbage")),
    )
    found = startup.foreign_held_units(holdings, ours, demo_node, names)
    assert sorted(found, key=lambda h: h.owner) == [
        startup.HeldUnits("ns/legacy/c", None, 1),
        startup.HeldUnits("ns/old/c", 256, 2),
    ]
    with pytest.raises(startup.StartupError, match="units of 256 MiB and unknown size") as refused:
        startup.check_held_units(found, names)
    assert "set memoryUnitMiB back" not in str(refused.value)  # two sizes: no single size to go back to


async def test_a_missing_pod_resources_socket_skips_the_check(tmp_path, caplog):
    assert await startup.read_held_units(tmp_path / "absent.sock", contract.Contract()) is None
    assert "cannot be checked" in caplog.text


async def test_a_pod_resources_socket_that_never_answers_is_refused(tmp_path):
    dead = tmp_path / "kubelet.sock"
    dead.touch()  # a socket path with nothing listening
    with pytest.raises(startup.StartupError, match="cannot read which units pods hold"):
        await startup.read_held_units(dead, contract.Contract(), attempts=2, retry_seconds=0.01)
