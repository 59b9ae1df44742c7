"""The node's set of device plugins (deviceplugin/manager.py) against the kubelet emulator: served
before kubelet exists, registered again after kubelet restarts (noticed through the directory
watch, or by polling without one), sockets removed on stop, refusals retried and counted, and
every Allocate announced to listeners."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from devicepluginkit import DEMO_RESOURCES
from kubelet_emulator import AdmissionError, kubelet_fixture, plugins, socket_dir_fixture  # noqa: F401 - fixtures

from gpuslice import config
from gpuslice.deviceplugin import manager
from gpuslice.node import health, metrics

pytestmark = pytest.mark.usefixtures("no_leftover_tasks")

MEMORY = "gpuslice.io/gpu-memory"


async def test_plugins_re_register_after_kubelet_wipes_the_directory_and_restarts(kubelet, socket_dir, demo_node):
    async with plugins(demo_node, socket_dir) as plugin_manager:
        await kubelet.wait_until(lambda: len(kubelet.registrations) == 4)
        await kubelet.allocate("gpuslice.io/gpu-memory", 10, "ns/keep/c")
        await kubelet.restart()
        await kubelet.wait_until(lambda: len(kubelet.registrations) == 8)
        await kubelet.wait_for_resource("gpuslice.io/gpu-memory", 636)
        assert {r.resource_name for r in kubelet.registrations[4:]} == set(DEMO_RESOURCES)
        assert sorted(p.name for p in socket_dir.iterdir()) == sorted([*DEMO_RESOURCES.values(), "kubelet.sock"])
        # the allocation survived (checkpoint) and the new plugin still answers
        assert len(kubelet.allocated("ns/keep/c")["gpuslice.io/gpu-memory"]) == 10
        await kubelet.allocate("gpuslice.io/gpu-memory", 5, "ns/after/c")
        await wait_ready(plugin_manager)


@contextlib.asynccontextmanager
async def watched_plugins(node, kubelet_dir):
    """The plugins with a safety-net pass far beyond any test: whatever they notice, the watch told them."""
    plugin_manager = manager.PluginManager(
        manager.build_resources(node, config.Config()),
        kubelet_dir=kubelet_dir,
        health_state=health.HealthState(),
        plugin_metrics=metrics.Metrics(),
        poll_interval=3600,
    )
    await plugin_manager.start()
    try:
        yield plugin_manager
    finally:
        await plugin_manager.stop()


async def test_a_kubelet_restart_is_noticed_through_the_directory_watch(kubelet, socket_dir, demo_node):
    async with watched_plugins(demo_node, socket_dir) as plugin_manager:
        await kubelet.wait_until(lambda: len(kubelet.registrations) == 4)
        await wait_ready(plugin_manager)
        await kubelet.restart()
        await kubelet.wait_until(lambda: len(kubelet.registrations) == 8)
        assert {r.resource_name for r in kubelet.registrations[4:]} == set(DEMO_RESOURCES)
        await kubelet.wait_for_resource("gpuslice.io/gpu-memory", 636)


async def test_a_deleted_plugin_socket_is_served_again_through_the_directory_watch(kubelet, socket_dir, demo_node):
    async with watched_plugins(demo_node, socket_dir) as plugin_manager:
        await kubelet.wait_until(lambda: len(kubelet.registrations) == 4)
        await wait_ready(plugin_manager)
        memory_socket = socket_dir / DEMO_RESOURCES["gpuslice.io/gpu-memory"]
        memory_socket.unlink()
        await kubelet.wait_until(lambda: len(kubelet.registrations) == 5)
        assert kubelet.registrations[4].resource_name == "gpuslice.io/gpu-memory"
        assert memory_socket.exists()
        await wait_ready(plugin_manager)


async def test_without_a_directory_watch_the_manager_polls_and_still_notices_a_restart(
    kubelet, socket_dir, demo_node, monkeypatch, caplog
):
    async def no_watch(*args, **kwargs):
        raise OSError(28, "inotify watch limit reached")
        yield  # an async generator, as watchfiles.awatch is

    monkeypatch.setattr(manager.watchfiles, "awatch", no_watch)
    async with watched_plugins(demo_node, socket_dir) as plugin_manager:
        await kubelet.wait_until(lambda: len(kubelet.registrations) == 4)
        await wait_ready(plugin_manager)
        await kubelet.restart()
        await kubelet.wait_until(lambda: len(kubelet.registrations) == 8)
    assert f"cannot watch {socket_dir}" in caplog.text and "inotify watch limit reached" in caplog.text


async def wait_ready(plugin_manager):
    async def ready():
        while not all(plugin_manager.registration_state().values()):
            await asyncio.sleep(0.02)

    await asyncio.wait_for(ready(), 10)


async def test_plugins_serve_before_kubelet_exists_and_register_once_it_appears(socket_dir, demo_node):
    from gpuslice.sim import kubelet as sim_kubelet

    socket_dir.mkdir(parents=True)
    async with plugins(demo_node, socket_dir) as plugin_manager:
        assert (socket_dir / DEMO_RESOURCES["gpuslice.io/gpu-memory"]).exists()
        assert not any(plugin_manager.registration_state().values())
        async with sim_kubelet.Kubelet(socket_dir) as late_kubelet:
            await late_kubelet.wait_until(lambda: len(late_kubelet.registrations) == 4)
            await wait_ready(plugin_manager)


async def test_stopping_the_plugins_removes_their_sockets(kubelet, socket_dir, demo_node):
    async with plugins(demo_node, socket_dir):
        await kubelet.wait_until(lambda: len(kubelet.registrations) == 4)
    assert [p.name for p in socket_dir.iterdir()] == ["kubelet.sock"]
    await kubelet.wait_until(lambda: kubelet.resources["gpuslice.io/gpu-memory"].allocatable == 0)


async def test_kubelet_refusal_is_retried_and_counted(socket_dir, demo_node):
    """A resource name kubelet refuses (prefix in kubernetes.io) never becomes ready. The
    configuration refuses such a prefix at start; this settings object is built past that check."""
    from gpuslice.sim import kubelet as sim_kubelet

    settings = config.Config(resource_prefix="gpu.kubernetes.io")
    plugin_metrics = metrics.Metrics()
    async with sim_kubelet.Kubelet(socket_dir) as emulator:
        plugin_manager = manager.PluginManager(
            manager.build_resources(demo_node, settings),
            kubelet_dir=socket_dir,
            health_state=health.HealthState(),
            plugin_metrics=plugin_metrics,
            poll_interval=0.05,
        )
        await plugin_manager.start()
        try:
            await emulator.wait_until(lambda: len(emulator.rejected_registrations) >= 8)
        finally:
            await plugin_manager.stop()
        assert "is invalid" in emulator.rejected_registrations[0][1]
        assert not any(plugin_manager.registration_state().values())
        failed = plugin_metrics.registrations.labels("gpu.kubernetes.io/gpu-memory", "failed")._value.get()
        assert failed >= 2


async def test_every_allocate_and_every_refusal_is_announced_to_listeners(kubelet, socket_dir, demo_node):
    heard = []
    async with plugins(demo_node, socket_dir) as plugin_manager:
        plugin_manager.add_allocation_listener(heard.append)
        await kubelet.wait_for_resource(MEMORY)
        await kubelet.wait_for_resource("gpuslice.io/mig-3g.40gb")
        await kubelet.allocate(MEMORY, 2, "ns/a/c")
        await kubelet.allocate("gpuslice.io/mig-3g.40gb", 1, "ns/b/c")
        with pytest.raises(AdmissionError):  # kubelet itself refuses: more than the node has
            await kubelet.allocate(MEMORY, 700, "ns/c/c")
        assert heard == [MEMORY, "gpuslice.io/mig-3g.40gb"]
        # The plugin refuses (the units would span GPUs): labels over-promised, so refresh them.
        with pytest.raises(AdmissionError):
            await kubelet.allocate(MEMORY, 400, "ns/d/c")
    assert heard == [MEMORY, "gpuslice.io/mig-3g.40gb", MEMORY]
