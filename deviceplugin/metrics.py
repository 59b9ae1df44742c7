"""The device plugin's Prometheus metrics and its small HTTP endpoint.

`Metrics` owns its own prometheus-client registry (no process-global state, so tests and
several plugins in one process do not collide). `build_app` serves:

* /healthz  200 while the process runs;
* /readyz   200 once every resource is registered with kubelet, else 503 listing the rest;
* /metrics  the registry in Prometheus text format.

May import prometheus_client and aiohttp; no other gpuslice module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import prometheus_client
from aiohttp import web

__all__ = ["Metrics", "build_app", "serve"]


class Metrics:
    def __init__(self) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        self.devices = prometheus_client.Gauge(
            "gpuslice_devices",
            "Devices advertised to kubelet, by resource and health",
            ["resource", "health"],
            registry=self.registry,
        )
        self.allocations = prometheus_client.Counter(
            "gpuslice_allocate_requests",
            "Container Allocate requests, by resource and result (ok, rejected)",
            ["resource", "result"],
            registry=self.registry,
        )
        self.preferred = prometheus_client.Counter(
            "gpuslice_preferred_allocation_requests",
            "Container GetPreferredAllocation requests, by resource",
            ["resource"],
            registry=self.registry,
        )
        self.registrations = prometheus_client.Counter(
            "gpuslice_registrations",
            "Registrations with kubelet, by resource and result (ok, failed)",
            ["resource", "result"],
            registry=self.registry,
        )

    def set_devices(self, resource: str, healthy: int, unhealthy: int) -> None:
        self.devices.labels(resource, "Healthy").set(healthy)
        self.devices.labels(resource, "Unhealthy").set(unhealthy)

    def render(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)


def build_app(metrics: Metrics, registered: Callable[[], Mapping[str, bool]]) -> web.Application:
    """The HTTP app; `registered()` says, per resource, whether kubelet has it registered."""

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        state = registered()
        missing = sorted(resource for resource, ok in state.items() if not ok)
        if state and not missing:
            return web.Response(text="ready: " + ", ".join(sorted(state)) + "\n")
        reason = "not registered with kubelet: " + ", ".join(missing) if missing else "no resources to advertise"
        return web.Response(status=503, text=reason + "\n")

    async def metrics_page(request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_page)
    return app


async def serve(app: web.Application, port: int, host: str = "0.0.0.0") -> web.AppRunner:
    """Start `app` on `port`; the caller awaits `runner.cleanup()` on shutdown."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner
