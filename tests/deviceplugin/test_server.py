"""One device plugin per resource (deviceplugin/server.py) as kubelet sees it: the fields it
registers with, and the devices ListAndWatch sends with their NUMA node."""

from __future__ import annotations

import pytest
from devicepluginkit import DEMO_RESOURCES
from kubelet_emulator import kubelet_fixture, plugins, socket_dir_fixture  # noqa: F401 - fixtures

pytestmark = pytest.mark.usefixtures("no_leftover_tasks")


async def test_every_resource_registers_with_the_fields_kubelet_expects(kubelet, socket_dir, demo_node):
    async with plugins(demo_node, socket_dir):
        await kubelet.wait_until(lambda: len(kubelet.registrations) == 4)
        fields = {
            r.resource_name: (
                r.version,
                r.endpoint,
                r.options.get_preferred_allocation_available,
                r.options.pre_start_required,
            )
            for r in kubelet.registrations
        }
        assert fields == {name: ("v1beta1", sock, True, False) for name, sock in DEMO_RESOURCES.items()}
        assert all(kubelet.endpoints[name].options.get_preferred_allocation_available for name in DEMO_RESOURCES)


async def test_memory_devices_carry_their_gpu_and_numa_node(kubelet, socket_dir, demo_node):
    async with plugins(demo_node, socket_dir):
        await kubelet.wait_for_resource("gpuslice.io/gpu-memory", 636)
        topology = kubelet.topology["gpuslice.io/gpu-memory"]
        assert topology["GPU-21302f2a-76fb-5940-b684-dae50f92c162::256Mi::317"] == (0,)
        assert max(len(device_id) for device_id in topology) <= 63
        await kubelet.wait_for_resource("gpuslice.io/mig-3g.40gb", 1)
        assert kubelet.topology["gpuslice.io/mig-3g.40gb"] == {"MIG-a9e5210c-5d91-514d-8f4d-a009532eea8c": (1,)}
