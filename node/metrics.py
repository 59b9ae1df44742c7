"""The device plugin's Prometheus metrics.

`Metrics` owns its own prometheus-client registry (no process-global state, so tests and
several plugins in one process do not collide). The HTTP app that serves it (/healthz, /readyz,
/metrics) is the runtime's (gpuslice/runtime.py, wired in node/runnables.py).

May import prometheus_client; no other gpuslice module.
"""

from __future__ import annotations

import prometheus_client

__all__ = ["Metrics"]


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
