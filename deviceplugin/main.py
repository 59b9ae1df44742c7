"""`gpuslice-device-plugin`: wires configuration, discovery, plugins, health and HTTP together.

    gpuslice-device-plugin [--config FILE] [--node-file FILE] [--kubelet-dir DIR]
                           [--pod-resources-socket PATH] [--node-name NAME] [--http-port N]
                           [every configuration flag, see docs/configuration.md]

The `<prefix>/config` label of the plugin's Node (--node-name) names the entry of the file's
`nodeConfigs` layered over the file (node/nodeconfig.py); a label naming no entry stops the
plugin. Configuration, node-file and start-up check errors (node/startup.py: e.g. pods still
hold units of another `memoryUnitMiB`) print one line and exit 2. SIGTERM/SIGINT stop serving,
remove the node labels the plugin published and the plugin sockets, cancel and await every task,
and exit 0; a loop that fails stops the plugin the same way and exits 1, naming it. The parts
run under gpuslice/runtime.py's supervisor (node/runnables.py).

With `steering.enabled` and a node name, the node labeller (node/labeller.py) runs as a
named task, refreshed after every Allocate and health change, scored from NVML when there is
NVML (deviceplugin/placement.py). With NVML and `monitor.enabled`, the usage monitor
(deviceplugin/monitor.py) runs as another named task and feeds memory pressure to that score.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence

from gpuslice import config as config_
from gpuslice import runtime
from gpuslice.deviceplugin import manager, monitor, placement, podapi, server
from gpuslice.node import health, inventory, labeller, metrics, nodeconfig, nvml_source, runnables, startup

__all__ = ["Options", "main", "parse_args", "run"]

log = logging.getLogger("gpuslice.deviceplugin")

DEFAULT_KUBELET_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_HTTP_PORT = 9400


@dataclasses.dataclass(frozen=True)
class Options:
    """Where this plugin runs (the command line's non-schema flags). kubelet's paths have no default
    here (only the command line defaults them to kubelet's), so no test can reach a real kubelet's."""

    kubelet_dir: str
    pod_resources_socket: str
    node_name: str = ""
    node_file: str | None = None
    http_port: int = DEFAULT_HTTP_PORT
    poll_interval: float = manager.RESYNC_SECONDS  # the kubelet directory's safety-net pass
    proc_root: str = "/proc"  # the host's /proc (the chart mounts it at /host/proc)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuslice-device-plugin",
        description="Kubelet device plugin: GPU memory as gpu-memory units and MIG slices as mig-<profile>.",
    )
    parser.add_argument("--node-file", metavar="FILE", help="use a simulated node (docs/node-file.md) instead of NVML")
    parser.add_argument(
        "--kubelet-dir", metavar="DIR", default=DEFAULT_KUBELET_DIR, help="kubelet's device-plugin directory"
    )
    parser.add_argument(
        "--pod-resources-socket",
        metavar="PATH",
        default=DEFAULT_POD_RESOURCES_SOCKET,
        help="kubelet's PodResources socket",
    )
    parser.add_argument(
        "--node-name", metavar="NAME", default=os.environ.get("NODE_NAME", ""), help="this node [NODE_NAME]"
    )
    parser.add_argument(
        "--http-port",
        metavar="N",
        type=int,
        default=DEFAULT_HTTP_PORT,
        help="/healthz, /readyz, /metrics port (0: off)",
    )
    parser.add_argument(
        "--proc-root", metavar="DIR", default="/proc", help="the host's /proc, where GPU processes' cgroups are read"
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    config_.add_arguments(parser, "device-plugin")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> tuple[config_.Config, Options, str]:
    """(Config, Options, log level); SystemExit(2) with one clear line on bad input."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        settings = config_.from_args(args)
    except config_.ConfigError as exc:
        parser.exit(2, f"gpuslice-device-plugin: configuration error: {exc}\n")
    if not 0 <= args.http_port <= 65535:
        parser.exit(2, f"gpuslice-device-plugin: --http-port must be 0..65535, got {args.http_port}\n")
    options = Options(
        kubelet_dir=args.kubelet_dir,
        pod_resources_socket=args.pod_resources_socket,
        node_name=args.node_name,
        node_file=args.node_file,
        http_port=args.http_port,
        proc_root=args.proc_root,
    )
    return settings, options, args.log_level


async def run(
    settings: config_.Config,
    options: Options,
    node: inventory.NodeInventory,
    *,
    nvml: nvml_source.Nvml | None = None,
    stop: asyncio.Event | None = None,
    node_api: labeller.NodeApi | None = None,
    pod_api: podapi.PodApi | None = None,
) -> int:
    """Serve until `stop` is set (or SIGTERM/SIGINT when `stop` is None); returns the exit status.

    `node_api` and `pod_api` replace the Kubernetes clients of the node labeller and of the usage
    monitor (tests).
    startup.StartupError (before anything is served, or when serving cannot start) says why the
    plugin must not run.
    """
    # What is served under migStrategy; health alone watches the real GPUs (it maps NVML's MIG
    # instance IDs to MIG devices, and reports the MIG devices or GPUs the view is made of).
    physical, node = node, startup.served_node(node, settings)
    startup.check_device_list(node, settings.contract)  # before the device IDs are built
    resources = manager.build_resources(node, settings)
    await _check_held_units(settings, options, node, resources)
    plugin_metrics = metrics.Metrics()
    health_state = health.HealthState()
    if not resources:
        log.warning("node %s has no GPU to advertise", options.node_name or "(unnamed)")
    plugins = manager.PluginManager(
        resources,
        kubelet_dir=options.kubelet_dir,
        health_state=health_state,
        plugin_metrics=plugin_metrics,
        poll_interval=options.poll_interval,
    )
    usage_monitor = None
    if nvml is not None and settings.monitor.enabled and resources:
        usage_monitor = monitor.UsageMonitor(
            nvml=nvml,
            node=node,
            settings=settings,
            node_name=options.node_name,
            pod_resources_socket=options.pod_resources_socket,
            proc_root=options.proc_root,
            api=pod_api,
            registry=plugin_metrics.registry,
        )
    node_labeller = None
    if settings.steering.enabled and options.node_name and resources:
        node_labeller = labeller.NodeLabeller(
            node=node,
            settings=settings,
            node_name=options.node_name,
            pod_resources_socket=options.pod_resources_socket,
            api=node_api,
            usage=placement.from_nvml(node, nvml, pressured=usage_monitor.pressured if usage_monitor else None)
            if nvml is not None
            else None,
            registry=plugin_metrics.registry,
            unhealthy=lambda: health_state.unhealthy,
        )
        health_state.add_listener(node_labeller.notify)
        plugins.add_allocation_listener(lambda resource: node_labeller.notify())
    elif settings.steering.enabled:
        log.info("steering labels off: no --node-name / NODE_NAME" if resources else "steering labels off: no GPU")

    async def stop_plugins() -> None:
        log.info("stopping: removing plugin sockets")
        await plugins.stop()

    # Started in this order, stopped in the reverse one (runnables.py).
    parts: list[runtime.Runnable] = []
    if nvml is not None:
        parts.append(runnables.health_monitor(health.HealthMonitor(nvml, physical, settings.health, health_state)))
    parts.append(runtime.Component("deviceplugin-plugins", start=plugins.start, stop=stop_plugins))
    if node_labeller is not None:
        parts.append(runnables.node_labeller("deviceplugin-node-labeller", node_labeller))
    if usage_monitor is not None:
        parts.append(runtime.Component("deviceplugin-usage-monitor", run=usage_monitor.run))
    http = runnables.http(
        options.http_port,
        plugin_metrics.registry,
        plugins.registration_state,
        waiting="not registered with kubelet",
        empty="no resources to advertise",
    )

    def started() -> None:
        log.info(
            "advertising %s from %s",
            ", ".join(f"{r.name} ({len(r.device_ids)})" for r in resources) or "nothing",
            node.source,
        )

    await runnables.supervise(parts, health=http, stop=stop, started=started)
    return 0


async def _check_held_units(
    settings: config_.Config, options: Options, node: inventory.NodeInventory, resources: Sequence[server.Resource]
) -> None:
    """StartupError while containers hold units this plugin would not advertise (startup.py)."""
    names = settings.contract
    memory = next((r for r in resources if r.name == names.gpu_memory_resource), None)
    if memory is None:
        return
    holdings = await startup.read_held_units(options.pod_resources_socket, names)
    if holdings:
        startup.check_held_units(startup.foreign_held_units(holdings, frozenset(memory.device_ids), node, names), names)


def node_settings(
    argv: Sequence[str] | None,
    settings: config_.Config,
    options: Options,
    read_labels: Callable[[str], Mapping[str, str]] | None = None,
) -> config_.Config:
    """`settings` with the nodeConfigs entry this node's label names layered in (nodeconfig.py);
    NodeConfigError when it cannot be chosen. `read_labels` replaces the API server (tests)."""
    if read_labels is None:
        # retried only where the choice matters; without nodeConfigs a failed read is a warning
        read_labels = functools.partial(nodeconfig.api_labels, attempts=3 if settings.node_config_names else 1)

    def reload(name: str) -> config_.Config:
        return config_.from_args(_parser().parse_args(argv), node_config=name)

    return nodeconfig.select(settings, options.node_name, read_labels=read_labels, reload=reload)


def main(argv: Sequence[str] | None = None) -> int:
    settings, options, level = parse_args(argv)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if level != "DEBUG":  # watchfiles logs each batch of changes at INFO; the manager logs what it did about them
        logging.getLogger("watchfiles").setLevel(logging.WARNING)
    try:
        settings = node_settings(argv, settings, options)
    except nodeconfig.NodeConfigError as exc:
        print(f"gpuslice-device-plugin: {exc}", file=sys.stderr)
        return 2
    try:
        node, nvml = nvml_source.load_node(options.node_file)
    except nvml_source.DiscoveryFailed as exc:
        print(f"gpuslice-device-plugin: {exc}", file=sys.stderr)
        return exc.status
    try:
        return asyncio.run(run(settings, options, node, nvml=nvml))
    except startup.StartupError as exc:
        print(f"gpuslice-device-plugin: {exc}", file=sys.stderr)
        return 2
    except runtime.RunnableFailed as exc:  # logged with its traceback: here one line naming it
        print(f"gpuslice-device-plugin: {exc}", file=sys.stderr)
        return 1
    finally:
        if nvml is not None:
            nvml.nvmlShutdown()


if __name__ == "__main__":
    sys.exit(main())
