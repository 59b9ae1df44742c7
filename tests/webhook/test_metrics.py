"""The webhook's admission metrics, kept as plain numbers (webhook/metrics.py), are exported as
prometheus_client's own Counter and Histogram export the same observations."""

from __future__ import annotations

import random

import prometheus_client
from prometheus_client import parser

from gpuslice.webhook import metrics


def samples(text: str, family: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of one metric family in an exposition, by name and labels ("_created" left out)."""
    found = {}
    for metric in parser.text_string_to_metric_families(text):
        if metric.name == family:
            for sample in metric.samples:
                if not sample.name.endswith("_created"):
                    found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_admission_counts_and_latency_are_exported_as_prometheus_clients_own_metrics_would_be() -> None:
    rng = random.Random(4)
    ours = metrics.Metrics()
    registry = prometheus_client.CollectorRegistry()
    admissions = prometheus_client.Counter("gpuslice_webhook_admissions", "", ["result"], registry=registry)
    conversions = prometheus_client.Counter("gpuslice_webhook_conversions", "", ["kind"], registry=registry)
    latency = prometheus_client.Histogram(
        "gpuslice_webhook_admission_duration_seconds", "", buckets=metrics._LATENCY_BUCKETS, registry=registry
    )
    # Values on every bound (a bucket holds what is <= its bound), between them, and past the last.
    seconds = [*metrics._LATENCY_BUCKETS, 0.0, 1e-6, 0.0007, 3.0, 11.0, 1e9]
    seconds += [rng.uniform(0, 0.02) for _ in range(200)]
    for value in seconds:
        result, kind = rng.choice(
            [("mutated", "gpu-fraction"), ("mutated", "cpu-pod"), ("denied", ""), ("ignored", ""), ("mutated", "")]
        )
        ours.count(result, kind)
        admissions.labels(result).inc()
        if kind:
            conversions.labels(kind).inc()
        ours.observe(value)
        latency.observe(value)
    exported = ours.exposition()[0].decode()
    expected = prometheus_client.generate_latest(registry).decode()
    for family in (
        "gpuslice_webhook_admissions",
        "gpuslice_webhook_conversions",
        "gpuslice_webhook_admission_duration_seconds",
    ):
        assert samples(exported, family) == samples(expected, family), family
        assert samples(exported, family), family
