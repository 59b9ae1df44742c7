"""Prometheus metrics of the usage monitor, rendered from its latest snapshot at scrape time.

A custom collector (prometheus-client's pattern for exporters) rather than labelled gauges: pods
come and go, and a snapshot rendered on each scrape never leaves a series behind for a pod that
is gone. `gpu` is the device the grant is on: the GPU's UUID, or a MIG device's.

Per container (labels namespace, pod, container, gpu):
  gpuslice_container_gpu_memory_used_bytes      memory its processes hold (NVML, per process)
  gpuslice_container_gpu_memory_granted_bytes   its grant (memory units x unit size, or the MIG device)
  gpuslice_container_gpu_utilization_ratio      SM busy share of its processes, 0..1 (where NVML gives it)
  gpuslice_container_gpu_memory_over_grant      1 while it uses more than grant + tolerance
Per device (label gpu):
  gpuslice_gpu_memory_used_bytes, gpuslice_gpu_memory_total_bytes   NVML's figures for the device
  gpuslice_gpu_memory_granted_bytes             sum of the grants kubelet has given out there
  gpuslice_gpu_memory_unattributed_bytes        held by processes gpuslice does not know, by reason
  gpuslice_gpu_monitor_up                       1 when the last sample of the device succeeded
  gpuslice_gpu_memory_pressure                  1 when the GPU's processes use more than granted
                                                (attribution.Snapshot.pressured); feeds the placement score

May import prometheus_client and gpuslice.deviceplugin.attribution.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator

import prometheus_client
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuslice.deviceplugin import attribution

__all__ = ["SnapshotCollector"]

_MIB = 1 << 20
_CONTAINER_LABELS = ["namespace", "pod", "container", "gpu"]


class SnapshotCollector(Collector):
    """Renders `snapshot()`; `over()` gives the container keys over their grant, `pressured()`
    the GPUs under memory pressure."""

    def __init__(
        self,
        snapshot: Callable[[], attribution.Snapshot | None],
        over: Callable[[], Collection[tuple[str, str, str, str]]],
        pressured: Callable[[], Collection[str]],
    ) -> None:
        self._snapshot = snapshot
        self._over = over
        self._pressured = pressured

    def register(self, registry: prometheus_client.CollectorRegistry) -> None:
        registry.register(self)

    def describe(self) -> list:  # registration must not sample
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snapshot = self._snapshot()
        if snapshot is None:
            return
        over = set(self._over())
        used = GaugeMetricFamily(
            "gpuslice_container_gpu_memory_used_bytes",
            "GPU memory held by the container's processes on this GPU or MIG device (NVML)",
            labels=_CONTAINER_LABELS,
        )
        granted = GaugeMetricFamily(
            "gpuslice_container_gpu_memory_granted_bytes",
            "GPU memory granted to the container on this GPU or MIG device (kubelet's PodResources)",
            labels=_CONTAINER_LABELS,
        )
        utilization = GaugeMetricFamily(
            "gpuslice_container_gpu_utilization_ratio",
            "Share of time the container's processes kept the GPU's SMs busy (NVML process samples), 0..1",
            labels=_CONTAINER_LABELS,
        )
        over_grant = GaugeMetricFamily(
            "gpuslice_container_gpu_memory_over_grant",
            "1 while the container uses more GPU memory than its grant plus monitor.overuseToleranceMiB",
            labels=_CONTAINER_LABELS,
        )
        for use in snapshot.containers:
            labels = [use.namespace, use.pod, use.container, use.device]
            used.add_metric(labels, use.used_mib * _MIB)
            granted.add_metric(labels, use.granted_mib * _MIB)
            if use.utilization is not None:
                utilization.add_metric(labels, use.utilization / 100.0)
            over_grant.add_metric(labels, 1.0 if use.key in over else 0.0)
        yield from (used, granted, utilization, over_grant)

        device_used = GaugeMetricFamily(
            "gpuslice_gpu_memory_used_bytes", "GPU memory in use on the device (NVML)", labels=["gpu"]
        )
        device_total = GaugeMetricFamily(
            "gpuslice_gpu_memory_total_bytes", "GPU memory of the device (NVML)", labels=["gpu"]
        )
        device_granted = GaugeMetricFamily(
            "gpuslice_gpu_memory_granted_bytes", "GPU memory granted to containers on the device", labels=["gpu"]
        )
        unattributed = GaugeMetricFamily(
            "gpuslice_gpu_memory_unattributed_bytes",
            "GPU memory held by processes gpuslice does not know, by reason "
            "(outside-pods, unknown-pod, no-grant, exited)",
            labels=["gpu", "reason"],
        )
        up = GaugeMetricFamily(
            "gpuslice_gpu_monitor_up", "1 when the last NVML sample of the device succeeded", labels=["gpu"]
        )
        pressure = GaugeMetricFamily(
            "gpuslice_gpu_memory_pressure",
            "1 when the GPU's processes use more memory than its grants account for (beyond the tolerance)",
            labels=["gpu"],
        )
        pressured = set(self._pressured())
        for device in snapshot.devices:
            up.add_metric([device.uuid], 1.0 if device.ok else 0.0)
            if not device.ok:
                continue
            device_used.add_metric([device.uuid], device.used_mib * _MIB)
            device_total.add_metric([device.uuid], device.total_mib * _MIB)
            device_granted.add_metric([device.uuid], device.granted_mib * _MIB)
            for reason, mib in sorted(device.unknown_mib.items()):
                unattributed.add_metric([device.uuid, reason], mib * _MIB)
        for gpu in sorted({d.gpu for d in snapshot.devices}):
            pressure.add_metric([gpu], 1.0 if gpu in pressured else 0.0)
        yield from (device_used, device_total, device_granted, unattributed, up, pressure)
