"""`gpuslice-dra-plugin`: the kubelet DRA plugin (DRA mode, docs/dra.md).

    gpuslice-dra-plugin [--config FILE] [--node-file FILE] [--node-name NAME]
                        [--kubelet-plugins-dir DIR] [--kubelet-registry-dir DIR] [--cdi-dir DIR]
                        [--state-dir DIR] [--http-port N] [--print-resource-slices]
                        [every configuration flag, see docs/configuration.md]

`--print-resource-slices` prints the ResourceSlices the plugin would publish (YAML) and exits:
no API server, no kubelet. Otherwise it recovers its checkpoint, serves kubelet's DRA and
registration sockets, publishes the node's ResourceSlices and, with NVML, watches GPU health
(a failed GPU is tainted in its slice). Configuration, node-file, checkpoint and start-up errors
(a port in use, a directory it cannot write) print one line and exit 2; SIGTERM/SIGINT stop
serving, remove the sockets, cancel and await every task, and exit 0; a loop that fails stops
the plugin the same way and exits 1, naming it. The parts run under gpuslice/runtime.py's
supervisor, started and stopped as the device plugin's are (node/runnables.py).

May import gpuslice.{config,runtime}, gpuslice.node's discovery, health, metrics,
runnables and startup (its StartupError and the node served under migStrategy) modules, and
gpuslice.dra.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import sys
from collections.abc import Sequence
from typing import Protocol

import prometheus_client
import yaml

from gpuslice import config as config_
from gpuslice import runtime
from gpuslice.dra import checkpoint, kube, preparer, publisher, server, slices, slicewatch
from gpuslice.dra import labeller as dra_labeller
from gpuslice.node import health, inventory, labeller, metrics, nvml_source, runnables, startup

__all__ = ["Options", "main", "parse_args", "run"]

log = logging.getLogger("gpuslice.dra")

DEFAULT_PLUGINS_DIR = "/var/lib/kubelet/plugins"
DEFAULT_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_CDI_DIR = "/var/run/cdi"
DEFAULT_HTTP_PORT = 9401
CHECKPOINT_FILE = "checkpoint.json"
EXAMPLE_NODE_NAME = "example-node"  # the pool of --print-resource-slices without --node-name


@dataclasses.dataclass(frozen=True)
class Options:
    """Where this plugin runs (the command line's non-schema flags). kubelet's and CDI's paths have no
    default here (only the command line defaults them to the host's), so no test can reach the host's."""

    plugins_dir: str
    registry_dir: str
    cdi_dir: str
    node_name: str = ""
    node_file: str | None = None
    state_dir: str = ""  # default: <plugins_dir>/<driver>
    http_port: int = DEFAULT_HTTP_PORT
    print_resource_slices: bool = False

    def plugin_dir(self, driver: str) -> str:
        return os.path.join(self.plugins_dir, driver)

    def checkpoint_path(self, driver: str) -> str:
        return os.path.join(self.state_dir or self.plugin_dir(driver), CHECKPOINT_FILE)


class Api(preparer.ClaimApi, publisher.SliceApi, Protocol):
    """What the plugin needs from the API server (kube.KubernetesApi; tests pass a fake)."""

    def close(self) -> None: ...


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuslice-dra-plugin",
        description="Kubelet DRA plugin: GPU memory as consumable capacity of resource.k8s.io/v1 devices.",
    )
    parser.add_argument("--node-file", metavar="FILE", help="use a simulated node (docs/node-file.md) instead of NVML")
    parser.add_argument(
        "--node-name", metavar="NAME", default=os.environ.get("NODE_NAME", ""), help="this node [NODE_NAME]"
    )
    parser.add_argument(
        "--kubelet-plugins-dir", metavar="DIR", default=DEFAULT_PLUGINS_DIR, help="kubelet's plugins directory"
    )
    parser.add_argument(
        "--kubelet-registry-dir",
        metavar="DIR",
        default=DEFAULT_REGISTRY_DIR,
        help="kubelet's plugins_registry directory",
    )
    parser.add_argument(
        "--cdi-dir", metavar="DIR", default=DEFAULT_CDI_DIR, help="where CDI specs of prepared claims go"
    )
    parser.add_argument(
        "--state-dir", metavar="DIR", default="", help="checkpoint directory (default: the plugin's dir)"
    )
    parser.add_argument(
        "--http-port",
        metavar="N",
        type=int,
        default=DEFAULT_HTTP_PORT,
        help="/healthz, /readyz, /metrics port (0: off)",
    )
    parser.add_argument(
        "--print-resource-slices",
        action="store_true",
        help="print the ResourceSlices this node would publish (YAML) and exit",
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    config_.add_arguments(parser, "dra-plugin")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> tuple[config_.Config, Options, str]:
    """(Config, Options, log level); SystemExit(2) with one clear line on bad input."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        settings = config_.from_args(args)
        settings.contract.dra_driver  # noqa: B018 - the prefix must give a valid driver name
    except (config_.ConfigError, ValueError) as exc:
        parser.exit(2, f"gpuslice-dra-plugin: configuration error: {exc}\n")
    if not 0 <= args.http_port <= 65535:
        parser.exit(2, f"gpuslice-dra-plugin: --http-port must be 0..65535, got {args.http_port}\n")
    if not args.print_resource_slices and not args.node_name:
        parser.exit(2, "gpuslice-dra-plugin: --node-name (or NODE_NAME) is required: it names the slices' pool\n")
    options = Options(
        node_name=args.node_name,
        node_file=args.node_file,
        plugins_dir=args.kubelet_plugins_dir,
        registry_dir=args.kubelet_registry_dir,
        cdi_dir=args.cdi_dir,
        state_dir=args.state_dir,
        http_port=args.http_port,
        print_resource_slices=args.print_resource_slices,
    )
    return settings, options, args.log_level


def resource_slices_yaml(node: inventory.NodeInventory, settings: config_.Config, node_name: str) -> str:
    """What --print-resource-slices prints: the slices as published (generation 1, no owner);
    StartupError when `migStrategy` cannot serve the node."""
    served = startup.served_node(node, settings)
    objects = slices.build_slices(served, settings.contract, node_name or EXAMPLE_NODE_NAME)
    return yaml.safe_dump_all(objects, sort_keys=False)


async def run(
    settings: config_.Config,
    options: Options,
    node: inventory.NodeInventory,
    *,
    nvml: nvml_source.Nvml | None = None,
    stop: asyncio.Event | None = None,
    api: Api | None = None,
    node_api: labeller.NodeApi | None = None,
) -> int:
    """Serve until `stop` is set (or SIGTERM/SIGINT when `stop` is None); returns the exit status.

    `api` replaces the Kubernetes client (tests pass a fake with the same methods); `node_api` the
    steering labeller's.
    """
    # What is published under migStrategy, as the device plugin serves it; health alone watches
    # the real GPUs (it reports the MIG devices and GPUs the published devices are made of).
    physical, node = node, startup.served_node(node, settings)
    own_api = api is None
    if api is None:
        api = kube.KubernetesApi()
    try:
        return await _serve(settings, options, node, physical, api, nvml=nvml, stop=stop, node_api=node_api)
    finally:
        if own_api:
            api.close()


async def _serve(
    settings: config_.Config,
    options: Options,
    node: inventory.NodeInventory,
    physical: inventory.NodeInventory,
    api: Api,
    *,
    nvml: nvml_source.Nvml | None,
    stop: asyncio.Event | None,
    node_api: labeller.NodeApi | None,
) -> int:
    driver = settings.contract.dra_driver
    plugin_metrics = metrics.Metrics()
    calls = prometheus_client.Counter(
        "gpuslice_dra_calls",
        "Kubelet calls of the DRA plugin, by call (prepare, unprepare, registration) and result",
        ["call", "result"],
        registry=plugin_metrics.registry,
    )
    prepared = prometheus_client.Gauge(
        "gpuslice_dra_prepared_claims", "Claims prepared on this node", registry=plugin_metrics.registry
    )
    health_state = health.HealthState()
    state = checkpoint.Checkpoint(options.checkpoint_path(driver), driver)
    claims = preparer.Preparer(
        node=node, settings=settings, pool=options.node_name, api=api, state=state, cdi_dir=options.cdi_dir
    )
    try:
        claims.recover()
    except checkpoint.CheckpointError as exc:
        log.error("%s (move it aside to start empty: kubelet then prepares its claims again)", exc)
        return 2
    claims.listeners.append(lambda: prepared.set(len(state.claims)))
    prepared.set(len(state.claims))
    slice_publisher = publisher.SlicePublisher(
        node=node,
        settings=settings,
        node_name=options.node_name,
        api=api,
        unhealthy=lambda: dict(health_state.reasons),  # UUID (or "*", the whole node) -> reason
    )
    health_state.add_listener(slice_publisher.notify)
    node_labeller = None
    if settings.steering.enabled and node.gpus:
        # The steering labels, from the claims prepared here (dra/labeller.py says why DRA needs them).
        node_labeller = dra_labeller.ClaimLabeller(
            lambda: dra_labeller.in_use(claims.prepared_shares(), settings.contract.unit_mib),
            node=node,
            settings=settings,
            node_name=options.node_name,
            api=node_api,
            registry=plugin_metrics.registry,
            unhealthy=lambda: health_state.unhealthy,
        )
        health_state.add_listener(node_labeller.notify)
        claims.listeners.append(node_labeller.notify)
    grpc_server = server.DraServer(
        claims, driver=driver, plugin_dir=options.plugin_dir(driver), registry_dir=options.registry_dir, counter=calls
    )

    async def stop_serving() -> None:
        log.info("stopping: removing the plugin sockets")
        await grpc_server.stop()

    # Started in this order, stopped in the reverse one (node/runnables.py).
    parts: list[runtime.Runnable] = []
    if nvml is not None:
        parts.append(runnables.health_monitor(health.HealthMonitor(nvml, physical, settings.health, health_state)))
    parts.append(runtime.Component("dra-server", start=grpc_server.start, stop=stop_serving))
    parts.append(runtime.Component("dra-slice-publisher", run=slice_publisher.run))
    if isinstance(api, kube.KubernetesApi):
        # Kubelet deletes the node's slices when it restarts: republish at once, not at the next resync.
        watch = slicewatch.NodeSlices(api.resource_api, options.node_name, driver, slice_publisher.notify)
        parts.append(runtime.Component("dra-slice-watch", run=watch.run))
    if node_labeller is not None:
        parts.append(runnables.node_labeller("dra-node-labeller", node_labeller))

    def readiness() -> dict[str, bool]:
        return {
            "kubelet registration": bool(grpc_server.registered),
            "resource slices": slice_publisher.synced.is_set(),
        }

    def started() -> None:
        log.info(
            "DRA driver %s on node %s: %d devices from %s",
            driver,
            options.node_name,
            len(slices.devices(node, settings.contract)),
            node.source,
        )

    http = runnables.http(options.http_port, plugin_metrics.registry, readiness, waiting="not ready yet")
    await runnables.supervise(parts, health=http, stop=stop, started=started)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    settings, options, level = parse_args(argv)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        node, nvml = nvml_source.load_node(options.node_file)
    except nvml_source.DiscoveryFailed as exc:
        print(f"gpuslice-dra-plugin: {exc}", file=sys.stderr)
        return exc.status
    try:
        if options.print_resource_slices:
            try:
                sys.stdout.write(resource_slices_yaml(node, settings, options.node_name))
            except slices.SliceError as exc:
                print(f"gpuslice-dra-plugin: {exc}", file=sys.stderr)
                return 2
            return 0
        return asyncio.run(run(settings, options, node, nvml=nvml))
    except startup.StartupError as exc:
        print(f"gpuslice-dra-plugin: {exc}", file=sys.stderr)
        return 2
    except runtime.RunnableFailed as exc:  # logged with its traceback: here one line naming it
        print(f"gpuslice-dra-plugin: {exc}", file=sys.stderr)
        return 1
    finally:
        if nvml is not None:
            nvml.nvmlShutdown()


if __name__ == "__main__":
    sys.exit(main())
