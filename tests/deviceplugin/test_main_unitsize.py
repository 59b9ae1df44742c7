"""A change of memoryUnitMiB never lets kubelet promise a GPU's memory twice (issue 13.3).

Kubelet's checkpoint keeps the device IDs of earlier allocations across plugin restarts; these
tests restart the plugin (deviceplugin/main.py) at another unit size against the kubelet emulator,
which keeps its allocations the same way. The check itself: tests/node/test_startup_unitsize.py.
"""

from __future__ import annotations

import asyncio
import pathlib

import pytest
from kubelet_emulator import kubelet_fixture, plugins, socket_dir_fixture  # noqa: F401 - fixtures

from gpuslice import config
from gpuslice.deviceplugin import main
from gpuslice.node import startup

pytestmark = pytest.mark.usefixtures("no_leftover_tasks")

REPO = pathlib.Path(__file__).resolve().parents[2]
DEMO_NODE = REPO / "gpuslice" / "examples" / "demo-node.yaml"
MEMORY = "gpuslice.io/gpu-memory"
H100_MIB = 81559


def settings_with(unit_mib: int) -> config.Config:
    return config.load(environ={}, overrides={"memoryUnitMiB": unit_mib})


def options_for(kubelet, socket_dir) -> main.Options:
    return main.Options(
        kubelet_dir=str(socket_dir),
        http_port=0,
        poll_interval=0.05,
        pod_resources_socket=str(kubelet.pod_resources_socket),
    )


async def serve_until_registered(kubelet, socket_dir, node, unit_mib: int, devices: int) -> list[str]:
    """Run the whole plugin (main.run) at `unit_mib` until kubelet has `devices` of it, then stop
    it; returns the devices kubelet could then allocate."""
    stop = asyncio.Event()
    task = asyncio.create_task(
        main.run(settings_with(unit_mib), options_for(kubelet, socket_dir), node, stop=stop), name="plugin-under-test"
    )
    try:
        await kubelet.wait_for_resource(MEMORY, devices)
        return kubelet.resources[MEMORY].available()
    finally:
        stop.set()
        assert await task == 0


async def test_a_smaller_unit_size_is_refused_while_pods_hold_the_larger_units(kubelet, socket_dir, demo_node):
    async with plugins(demo_node, socket_dir, settings_with(256)):
        await kubelet.wait_for_resource(MEMORY, 2 * (H100_MIB // 256))
        await kubelet.allocate(MEMORY, 159, "default/train/main")  # half an H100 at 256 MiB
    with pytest.raises(startup.StartupError) as refused:
        await main.run(settings_with(128), options_for(kubelet, socket_dir), demo_node, stop=asyncio.Event())
    message = str(refused.value)
    assert "memoryUnitMiB is 128" in message and "units of 256 MiB" in message
    assert "default/train/main" in message and "set memoryUnitMiB back to 256" in message
    assert "\n" not in message
    # nothing was served: kubelet has no endpoint to allocate the new units from
    assert [p.name for p in socket_dir.iterdir()] == ["kubelet.sock"]


async def test_the_command_prints_one_line_and_exits_2_when_units_of_another_size_are_held(
    kubelet, socket_dir, demo_node, capsys
):
    async with plugins(demo_node, socket_dir, settings_with(256)):
        await kubelet.wait_for_resource(MEMORY, 2 * (H100_MIB // 256))
        await kubelet.allocate(MEMORY, 10, "ns/p/c")
    argv = [
        "--node-file",
        str(DEMO_NODE),
        "--kubelet-dir",
        str(socket_dir),
        "--http-port",
        "0",
        "--pod-resources-socket",
        str(kubelet.pod_resources_socket),
        "--memory-unit-mib",
        "512",
    ]
    assert await asyncio.to_thread(main.main, argv) == 2
    stderr = capsys.readouterr().err.strip()
    assert len(stderr.splitlines()) == 1
    assert stderr.startswith("gpuslice-device-plugin: memoryUnitMiB is 512") and "Changing the unit size" in stderr


async def test_once_the_old_pods_are_gone_the_new_size_starts_with_every_unit_free(kubelet, socket_dir, demo_node):
    async with plugins(demo_node, socket_dir, settings_with(256)):
        await kubelet.wait_for_resource(MEMORY, 2 * (H100_MIB // 256))
        await kubelet.allocate(MEMORY, 159, "default/train/main")
    kubelet.release("default/train/main")
    free = await serve_until_registered(kubelet, socket_dir, demo_node, 128, 2 * (H100_MIB // 128))
    assert len(free) == 2 * (H100_MIB // 128) and all("::128Mi::" in d for d in free)


async def test_a_restart_at_the_same_unit_size_keeps_the_held_units_taken(kubelet, socket_dir, demo_node):
    total = 2 * (H100_MIB // 256)
    async with plugins(demo_node, socket_dir, settings_with(256)):
        await kubelet.wait_for_resource(MEMORY, total)
        await kubelet.allocate(MEMORY, 159, "default/train/main")
    free = await serve_until_registered(kubelet, socket_dir, demo_node, 256, total)
    assert len(free) == total - 159
