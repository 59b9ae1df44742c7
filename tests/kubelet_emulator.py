"""Test helpers around the kubelet emulator (gpuslice.sim.kubelet): a short socket directory
(unix socket paths are limited to 107 bytes, pytest's tmp_path can be longer), a running
emulator, and the device plugins of a node served against it.
"""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator

import pytest

from gpuslice import config
from gpuslice.deviceplugin import manager
from gpuslice.node import health, inventory, metrics
from gpuslice.sim import kubelet as sim_kubelet

Kubelet = sim_kubelet.Kubelet
AdmissionError = sim_kubelet.AdmissionError


@pytest.fixture(name="socket_dir")
def socket_dir_fixture() -> Iterator[pathlib.Path]:
    """A short temporary directory holding `device-plugins/` and `pod-resources/`."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="gs-", dir="/tmp"))
    try:
        yield root / "device-plugins"
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(name="kubelet")
async def kubelet_fixture(socket_dir: pathlib.Path) -> AsyncIterator[sim_kubelet.Kubelet]:
    async with sim_kubelet.Kubelet(socket_dir) as emulator:
        yield emulator


@contextlib.asynccontextmanager
async def plugins(
    node: inventory.NodeInventory,
    kubelet_dir: pathlib.Path,
    settings: config.Config | None = None,
    health_state: health.HealthState | None = None,
) -> AsyncIterator[manager.PluginManager]:
    """The node's device plugins, served and registered; stopped (sockets removed) on exit."""
    settings = settings or config.Config()
    plugin_manager = manager.PluginManager(
        manager.build_resources(node, settings),
        kubelet_dir=kubelet_dir,
        health_state=health_state or health.HealthState(),
        plugin_metrics=metrics.Metrics(),
        poll_interval=0.05,
    )
    await plugin_manager.start()
    try:
        yield plugin_manager
    finally:
        await plugin_manager.stop()
