"""The start-up and shutdown both kubelet plugins share (this one and dra/), as runtime runnables.

Each plugin's main builds its own parts and then: the HTTP health app on `--http-port` (0: none),
the GPU health monitor, its kubelet-facing server, its loops, and last the steering labeller,
which on shutdown withdraws the node's labels (a node whose plugin is gone must not keep drawing
pods; opting a node out removes the DaemonSet's pod, so this runs then too). `supervise` runs
them (gpuslice/runtime.py): stopped in reverse order on SIGTERM/SIGINT, and a start that fails on
the host (a port in use, a directory it cannot write, gRPC that cannot bind) is a
startup.StartupError, which the mains print in one line and exit 2 for.

May import gpuslice.runtime and the device plugin's health, labeller and startup modules.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping, Sequence

import prometheus_client

from gpuslice import runtime
from gpuslice.node import health, labeller, startup

__all__ = ["health_monitor", "http", "node_labeller", "supervise"]

log = logging.getLogger(__name__)


def http(
    port: int,
    registry: prometheus_client.CollectorRegistry,
    checks: Callable[[], Mapping[str, bool]],
    *,
    waiting: str,
    empty: str = "nothing to serve",
) -> runtime.Health | None:
    """/healthz, /readyz (from `checks`), /metrics on `port` on every address; None for port 0."""
    if not port:
        return None
    return runtime.Health(port=port, registry=registry, checks=checks, waiting=waiting, empty=empty)


def health_monitor(monitor: health.HealthMonitor) -> runtime.Component:
    return runtime.Component("health-monitor", start=monitor.start, stop=monitor.stop)


def node_labeller(name: str, node_labeller: labeller.NodeLabeller) -> runtime.Component:
    """The steering labeller's loop; stopping it withdraws its labels."""
    return runtime.Component(name, run=node_labeller.run, stop=functools.partial(_withdraw, node_labeller))


async def _withdraw(node_labeller: labeller.NodeLabeller) -> None:
    await node_labeller.shutdown(withdraw=True)


async def supervise(
    runnables: Sequence[runtime.Runnable],
    *,
    health: runtime.Health | None,
    stop: asyncio.Event | None,
    started: Callable[[], None],
) -> None:
    """Serve until `stop` (or SIGTERM/SIGINT); StartupError when serving cannot start."""
    try:
        await runtime.Supervisor(runnables, health=health, stop=stop, started=started).run()
    except (OSError, RuntimeError) as exc:  # raised by a start: a failed run is runtime.RunnableFailed
        log.debug("start failed", exc_info=True)
        raise startup.StartupError(f"cannot start serving: {exc}") from None
