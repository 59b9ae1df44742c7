"""Which component reads which key: each component's flags, the keys a node configuration may set,
and why the others may not. Pinned key by key, so that ownership declared on the sections keeps
every component's command line exactly as it was."""

from __future__ import annotations

import argparse

import pytest

from gpuslice import config

SHARED = ["--config", "--resource-prefix", "--memory-unit-mib"]
NODE_PLUGIN = [
    *SHARED,
    "--device-list-strategy",
    "--cdi-kind",
    "--mig-strategy",
    "--mps-enabled",
    "--mps-pipe-directory",
    "--mps-container-pipe-directory",
    "--mps-shm-directory",
    "--health-enabled",
    "--health-ignored-xids",
    "--health-recovery-interval-seconds",
    "--health-event-timeout-ms",
    "--steering-enabled",
    "--steering-label-min-interval-seconds",
    "--steering-pod-resources-poll-seconds",
    "--steering-cpu-per-gpu-milli",
    "--monitor-enabled",
    "--monitor-interval-seconds",
    "--monitor-overuse-policy",
    "--monitor-overuse-tolerance-mib",
    "--monitor-overuse-seconds",
]
FLAGS = {
    "webhook": [
        *SHARED,
        "--steering-enabled",
        "--steering-cpu-pods",
        "--steering-cpu-pods-nearly-full-mib",
        "--steering-cpu-pods-nearly-full-cpu-percent",
        "--steering-cpu-per-gpu-milli",
        "--default-gpu-memory-mib",
        "--convert-whole-gpus",
        "--ignored-namespaces",
        "--scheduler-name",
        "--converted-pod-tolerations",
        "--dra-enabled",
        "--pacing-enabled",
        "--controller-lease-name",
        "--controller-lease-namespace",
        "--controller-lease-seconds",
        "--webhook-idle-timeout-seconds",
        "--webhook-first-request-timeout-seconds",
        "--webhook-body-timeout-seconds",
        "--webhook-tls-handshake-timeout-seconds",
        "--webhook-max-connection-age-seconds",
        "--webhook-max-connections",
        "--webhook-shutdown-delay-seconds",
    ],
    "device-plugin": [*NODE_PLUGIN, "--pacing-enabled"],
    "dra-plugin": [*NODE_PLUGIN, "--dra-slice-min-interval-seconds", "--dra-slice-resync-seconds", "--pacing-enabled"],
    "controller": [
        *SHARED,
        "--requeue-enabled",
        "--requeue-max-attempts",
        "--requeue-backoff-seconds",
        "--pacing-enabled",
        "--pacing-max-in-flight",
        "--pacing-bind-timeout-seconds",
        "--pacing-lag-timeout-seconds",
        "--controller-lease-name",
        "--controller-lease-namespace",
        "--controller-lease-seconds",
    ],
}
EVERY_FLAG = [
    *SHARED,
    "--device-list-strategy",
    "--cdi-kind",
    "--mig-strategy",
    "--mps-enabled",
    "--mps-pipe-directory",
    "--mps-container-pipe-directory",
    "--mps-shm-directory",
    "--health-enabled",
    "--health-ignored-xids",
    "--health-recovery-interval-seconds",
    "--health-event-timeout-ms",
    "--steering-enabled",
    "--steering-label-min-interval-seconds",
    "--steering-pod-resources-poll-seconds",
    "--steering-cpu-pods",
    "--steering-cpu-pods-nearly-full-mib",
    "--steering-cpu-pods-nearly-full-cpu-percent",
    "--steering-cpu-per-gpu-milli",
    "--monitor-enabled",
    "--monitor-interval-seconds",
    "--monitor-overuse-policy",
    "--monitor-overuse-tolerance-mib",
    "--monitor-overuse-seconds",
    "--default-gpu-memory-mib",
    "--convert-whole-gpus",
    "--ignored-namespaces",
    "--scheduler-name",
    "--converted-pod-tolerations",
    "--dra-enabled",
    "--dra-slice-min-interval-seconds",
    "--dra-slice-resync-seconds",
    "--requeue-enabled",
    "--requeue-max-attempts",
    "--requeue-backoff-seconds",
    "--pacing-enabled",
    "--pacing-max-in-flight",
    "--pacing-bind-timeout-seconds",
    "--pacing-lag-timeout-seconds",
    "--controller-lease-name",
    "--controller-lease-namespace",
    "--controller-lease-seconds",
    "--webhook-idle-timeout-seconds",
    "--webhook-first-request-timeout-seconds",
    "--webhook-body-timeout-seconds",
    "--webhook-tls-handshake-timeout-seconds",
    "--webhook-max-connection-age-seconds",
    "--webhook-max-connections",
    "--webhook-shutdown-delay-seconds",
]


def flags(component: str | None) -> list[str]:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, component)
    return [option for action in parser._actions for option in action.option_strings if option not in ("-h", "--help")]


@pytest.mark.parametrize("component", config.COMPONENTS)
def test_each_component_has_exactly_its_flags_in_schema_order(component):
    assert flags(component) == FLAGS[component]


def test_without_a_component_every_key_is_a_flag():
    assert flags(None) == EVERY_FLAG == ["--config"] + [field.flag for field in config.FIELDS]


def test_every_key_has_its_flag_environment_variable_and_yaml_path():
    for field in config.FIELDS:
        assert field.env == "GPUSLICE_" + field.flag[2:].replace("-", "_").upper()
    assert [field.path for field in config.FIELDS][:6] == [
        "resourcePrefix",
        "memoryUnitMiB",
        "deviceListStrategy",
        "cdiKind",
        "migStrategy",
        "mps.enabled",
    ]
    by_path = {field.path: field for field in config.FIELDS}
    assert by_path["steering.cpuPodsNearlyFullMiB"].flag == "--steering-cpu-pods-nearly-full-mib"
    assert by_path["monitor.overuseToleranceMiB"].env == "GPUSLICE_MONITOR_OVERUSE_TOLERANCE_MIB"
    assert by_path["health.ignoredXids"].attr == "health.ignored_xids"


PER_NODE_KEYS = (
    "deviceListStrategy",
    "cdiKind",
    "migStrategy",
    "health.enabled",
    "health.ignoredXids",
    "health.recoveryIntervalSeconds",
    "health.eventTimeoutMs",
    "steering.labelMinIntervalSeconds",
    "steering.podResourcesPollSeconds",
    "monitor.intervalSeconds",
    "monitor.overuseToleranceMiB",
    "monitor.overuseSeconds",
)

CLUSTER_WIDE = "the webhook reads it too, with one value for the whole cluster"
CHART = "the chart grants what it needs (MPS daemon, host /proc, hostPID, eviction rights) to every plugin pod alike"
WEBHOOK_ONLY = "only the webhook reads it"
DRA = "the DRA plugin does not read node configurations"
CONTROLLER_ONLY = "only the controller reads it"
CONTROLLER_AND_WEBHOOK = "only the controller and the webhook read it"
# Why each other key cannot be set by a node configuration. The controller's keys and
# pacing.enabled were once all "only the webhook reads it" (a fallback written before the
# controller existed); their reasons now follow from who reads them.
NOT_PER_NODE = {
    "resourcePrefix": CLUSTER_WIDE,
    "memoryUnitMiB": CLUSTER_WIDE,
    "mps.enabled": CHART,
    "mps.pipeDirectory": CHART,
    "mps.containerPipeDirectory": CHART,
    "mps.shmDirectory": CHART,
    "steering.enabled": CLUSTER_WIDE,
    "steering.cpuPods": WEBHOOK_ONLY,
    "steering.cpuPodsNearlyFullMiB": WEBHOOK_ONLY,
    "steering.cpuPodsNearlyFullCpuPercent": WEBHOOK_ONLY,
    "steering.cpuPerGpuMilli": CLUSTER_WIDE,
    "monitor.enabled": CHART,
    "monitor.overusePolicy": CHART,
    "defaultGpuMemoryMiB": WEBHOOK_ONLY,
    "convertWholeGpus": WEBHOOK_ONLY,
    "ignoredNamespaces": WEBHOOK_ONLY,
    "schedulerName": WEBHOOK_ONLY,
    "convertedPodTolerations": WEBHOOK_ONLY,
    "dra.enabled": DRA,
    "dra.sliceMinIntervalSeconds": DRA,
    "dra.sliceResyncSeconds": DRA,
    "requeue.enabled": CONTROLLER_ONLY,
    "requeue.maxAttempts": CONTROLLER_ONLY,
    "requeue.backoffSeconds": CONTROLLER_ONLY,
    "pacing.enabled": CLUSTER_WIDE,
    "pacing.maxInFlight": CONTROLLER_ONLY,
    "pacing.bindTimeoutSeconds": CONTROLLER_ONLY,
    "pacing.lagTimeoutSeconds": CONTROLLER_ONLY,
    "controller.leaseName": CONTROLLER_AND_WEBHOOK,
    "controller.leaseNamespace": CONTROLLER_AND_WEBHOOK,
    "controller.leaseSeconds": CONTROLLER_AND_WEBHOOK,
    "webhook.idleTimeoutSeconds": WEBHOOK_ONLY,
    "webhook.firstRequestTimeoutSeconds": WEBHOOK_ONLY,
    "webhook.bodyTimeoutSeconds": WEBHOOK_ONLY,
    "webhook.tlsHandshakeTimeoutSeconds": WEBHOOK_ONLY,
    "webhook.maxConnectionAgeSeconds": WEBHOOK_ONLY,
    "webhook.maxConnections": WEBHOOK_ONLY,
    "webhook.shutdownDelaySeconds": WEBHOOK_ONLY,
}


def test_a_node_configuration_may_set_exactly_the_device_plugin_s_own_keys():
    assert config.PER_NODE_KEYS == PER_NODE_KEYS
    assert set(PER_NODE_KEYS) | set(NOT_PER_NODE) == {field.path for field in config.FIELDS}


@pytest.mark.parametrize("path", list(NOT_PER_NODE))
def test_a_node_configuration_setting_another_key_is_refused_with_the_reason(path):
    head, _, tail = path.partition(".")
    entry = {head: {tail: None}} if tail else {head: None}
    with pytest.raises(config.ConfigError) as error:
        config._node_configs({config.NODE_CONFIGS_KEY: {"a": entry}}, "test")
    assert str(error.value) == (
        f"nodeConfigs.a.{path}: cannot differ between nodes: {NOT_PER_NODE[path]}; a node configuration may set "
        + ", ".join(PER_NODE_KEYS)
    )
