"""Prometheus metrics of the webhook, in a registry of their own (no process-global state):
admissions by result, admission latency, conversions by kind, 5xx answers.

What every admission updates (its result, its conversion, its latency) is kept in plain numbers
and read by a collector at each scrape: prometheus_client's Counter and Histogram take a lock per
update, some 2.5 µs of Python per admission on the path issue 13.8 measures, where only the
event loop's thread ever writes these and the scrape runs on that thread too.

May import prometheus_client only.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import prometheus_client
from prometheus_client import core, registry

__all__ = ["Metrics"]

# Admission latency is sub-millisecond to a few milliseconds; kube-apiserver's timeout is 10 s.
_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5, 10.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = prometheus_client.CollectorRegistry(auto_describe=True)
        self._admissions = _Admissions()
        self.registry.register(self._admissions)
        self.http_errors = prometheus_client.Counter(
            "gpuslice_webhook_http_errors",
            "HTTP answers with a 5xx status, by path and status (an internal error or not ready)",
            ["path", "status"],
            registry=self.registry,
        )

        self.connections_refused = prometheus_client.Counter(
            "gpuslice_webhook_connections_refused",
            "Connections answered 503 and closed because webhook.maxConnections were open",
            registry=self.registry,
        )
        self._connections_closed = prometheus_client.Counter(
            "gpuslice_webhook_connections_closed",
            "Connections the webhook closed: `evicted` (idle the longest when webhook.maxConnections were "
            "open and another came), `no request` (no request within webhook.firstRequestTimeoutSeconds)",
            ["reason"],
            registry=self.registry,
        )
        self.open_connections = prometheus_client.Gauge(
            "gpuslice_webhook_open_connections",
            "HTTPS connections open (after their TLS handshake), as of the last sweep",
            registry=self.registry,
        )
        self.pacer_alive = prometheus_client.Gauge(
            "gpuslice_webhook_pacer_alive",
            "1 while a pacer renews its Lease (with pacing.enabled pods are gated only then), else 0",
            registry=self.registry,
        )
        self.cpu_pod_cpu_share = prometheus_client.Gauge(
            "gpuslice_webhook_cpu_pod_cpu_share",
            "Share (0-1) of the CPU asked by the pods this replica admitted that pods asking for no device"
            " asked, over about the last 5,000 (NaN before 500); above steering.cpuPodsNearlyFullCpuPercent"
            " they prefer nodes with little GPU memory left",
            registry=self.registry,
        )
        self._untrusted_nodes = _UntrustedNodes()
        self.registry.register(self._untrusted_nodes)
        self._repeats = _CounterOf(
            "gpuslice_webhook_repeat_answers",
            "AdmissionReviews answered from memory: a body, or the fields the webhook reads, seen before but "
            "for the uid, the cluster view unchanged (replicas of one controller, pods of one template)",
        )
        self.registry.register(self._repeats)
        self._promises = _PromisesReturned()
        self.registry.register(self._promises)
        self.shared_promises = prometheus_client.Gauge(
            "gpuslice_webhook_shared_promises",
            "1 once this replica sees every replica's converted pods (its pending-pod watch has listed) and "
            "counts their promises; 0 while it steers by its own promises alone",
            registry=self.registry,
        )
        self._promises_from_others = _CounterOf(
            "gpuslice_webhook_promises_from_other_replicas",
            "Converted pods another webhook replica admitted, seen pending and unbound by this one and promised "
            "here too, so every replica steers knowing what all of them admitted",
        )
        self.registry.register(self._promises_from_others)

    def count(self, result: str, kind: str = "") -> None:
        """One admission answered with `result` (converting a pod of `kind`, when not "")."""
        admissions = self._admissions
        admissions.results[result] = admissions.results.get(result, 0) + 1
        if kind:
            admissions.kinds[kind] = admissions.kinds.get(kind, 0) + 1

    def observe(self, seconds: float) -> None:
        """One admission took `seconds` to answer."""
        admissions = self._admissions
        admissions.buckets[bisect.bisect_left(_LATENCY_BUCKETS, seconds)] += 1
        admissions.seconds += seconds

    def http_error(self, path: str, status: int) -> Any:
        """The 5xx counter for `path` and `status` (known paths only: a client picks the path)."""
        known = path if path in ("/mutate", "/healthz", "/readyz", "/metrics") else "other"
        return self.http_errors.labels(known, str(status))

    def connections_closed(self, reason: str) -> Any:
        return self._connections_closed.labels(reason)

    def track_untrusted_nodes(self, untrusted: Callable[[], Mapping[str, tuple[str, str]]]) -> None:
        """Export the nodes the cluster view leaves out, read at each scrape (node -> (reason, text))."""
        self._untrusted_nodes.source = untrusted

    def track_pacer(self, alive: Callable[[], bool]) -> None:
        """Export whether a pacer is alive (the cluster view's word), read at each scrape."""
        self.pacer_alive.set_function(lambda: float(alive()))

    def track_cpu_pod_share(self, share: Callable[[], float | None]) -> None:
        """Export the CPU-only pods' share of the CPU admitted (webhook/cpudemand.py), read at each scrape."""
        self.cpu_pod_cpu_share.set_function(lambda: _nan_if_none(share()))

    def track_repeats(self, count: Callable[[], int]) -> None:
        """Export how many admissions were answered from memory (webhook/repeats.py), read at each
        scrape: counting here would cost every admission a lock."""
        self._repeats.source = count

    def track_promises_returned(self, counts: Callable[[], Mapping[str, int]]) -> None:
        """Export the promises given back, by reason (webhook/waiting.py, webhook/promises.py), read at each scrape."""
        self._promises.source = counts

    def track_shared_promises(self, listed: Callable[[], bool], from_others: Callable[[], int]) -> None:
        """Export whether this replica sees the other replicas' promises (its pending-pod watch has
        listed; until then it steers by its own promises alone) and how many it has counted."""
        self.shared_promises.set_function(lambda: float(listed()))
        self._promises_from_others.source = from_others

    def exposition(self) -> tuple[bytes, str]:
        """(body, content type) for GET /metrics."""
        return prometheus_client.generate_latest(self.registry), prometheus_client.CONTENT_TYPE_LATEST


class _Admissions(registry.Collector):
    """Admissions by result, conversions by kind, and the latency histogram, as plain numbers
    (`Metrics.count`, `Metrics.observe`); exported as prometheus_client's Counter and Histogram
    would export them."""

    def __init__(self) -> None:
        self.created = time.time()
        self.results: dict[str, int] = {}
        self.kinds: dict[str, int] = {}
        self.buckets = [0] * (len(_LATENCY_BUCKETS) + 1)  # the last: above every bound (+Inf)
        self.seconds = 0.0

    def collect(self) -> Iterator[core.Metric]:
        yield self._counter(
            "gpuslice_webhook_admissions",
            "AdmissionReviews answered, by result (mutated, unchanged, denied, ignored, malformed)",
            "result",
            self.results,
        )
        yield self._counter(
            "gpuslice_webhook_conversions",
            "Pods mutated, by kind (gpu-memory, gpu-fraction, mig, whole-gpus, cpu-pod); dry runs not counted",
            "kind",
            self.kinds,
        )
        latency = core.HistogramMetricFamily(
            "gpuslice_webhook_admission_duration_seconds",
            "Time to answer one AdmissionReview, from body read to response built",
        )
        cumulative, total = [], 0
        for bound, count in zip([*map(str, _LATENCY_BUCKETS), "+Inf"], self.buckets, strict=True):
            total += count
            cumulative.append((bound, total))
        latency.add_metric([], cumulative, self.seconds)
        yield latency

    def _counter(self, name: str, documentation: str, label: str, counts: dict[str, int]) -> core.Metric:
        family = core.CounterMetricFamily(name, documentation, labels=[label])
        for value, count in sorted(counts.items()):
            family.add_metric([value], count, created=self.created)
        return family


class _UntrustedNodes(registry.Collector):
    def __init__(self) -> None:
        self.source: Callable[[], Mapping[str, tuple[str, str]]] = dict

    def collect(self) -> Iterator[core.Metric]:
        family = core.GaugeMetricFamily(
            "gpuslice_webhook_untrusted_nodes",
            "Nodes whose gpuslice labels are left out of GPU class choice, by node and reason "
            "(malformed-label, memory-out-of-range, count-out-of-range, free-above-total, capacity-mismatch, "
            "device-plugin-down)",
            labels=["node", "reason"],
        )
        for node, (reason, _) in sorted(self.source().items()):
            family.add_metric([node, reason], 1.0)
        yield family


class _PromisesReturned(registry.Collector):
    def __init__(self) -> None:
        self.source: Callable[[], Mapping[str, int]] = dict

    def collect(self) -> Iterator[core.Metric]:
        family = core.CounterMetricFamily(
            "gpuslice_webhook_promises_returned",
            "Promises of converted pods given back before their units showed in labels, by reason: unschedulable "
            "(the scheduler found no node), not-created (the pod was refused after this webhook admitted it, and "
            "the conversions counter counts it although it never existed), refused (kubelet refused the bound pod)",
            labels=["reason"],
        )
        for reason, count in sorted(self.source().items()):
            family.add_metric([reason], count)
        yield family


class _CounterOf(registry.Collector):
    """A counter whose value another object keeps, read at each scrape (counting here would cost
    the path that counts a lock)."""

    def __init__(self, name: str, documentation: str) -> None:
        self.name, self.documentation = name, documentation
        self.source: Callable[[], int] = int

    def collect(self) -> Iterator[core.Metric]:
        yield core.CounterMetricFamily(self.name, self.documentation, value=self.source())


def _nan_if_none(value: float | None) -> float:
    return float("nan") if value is None else value
