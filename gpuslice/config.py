"""The one configuration schema shared by the webhook and the device plugin.

Sources, highest first: command-line flag > environment variable > named node configuration >
YAML file > default. Every key is declared once in `FIELDS` (YAML path, type, default, check,
help); from that table come the flags (`--memory-unit-mib`), the environment variables
(`GPUSLICE_MEMORY_UNIT_MIB`) and the documentation in docs/configuration.md.

The file may hold `nodeConfigs`: named partial configurations of the node-side keys in
`PER_NODE_KEYS`, of which a node picks one with its `<prefix>/config` label (the device plugin
reads the label; `load(node_config=...)` layers the entry over the file). Every entry is
validated whenever the file is loaded, by every component, whichever entry a node picks.

`load()` returns a frozen `Config` or raises `ConfigError` with a message naming the key,
the value and what is accepted. Nothing here imports other gpuslice modules except the
contract (for defaults).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import json
import os
import pathlib
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import yaml

from gpuslice import contract

__all__ = [
    "Config",
    "MpsConfig",
    "HealthConfig",
    "SteeringConfig",
    "MonitorConfig",
    "DraConfig",
    "MIG_STRATEGIES",
    "WebhookConfig",
    "ConfigError",
    "UnknownNodeConfig",
    "PER_NODE_KEYS",
    "FIELDS",
    "load",
    "add_arguments",
]

SCHEMA_VERSION = "v1"
DEVICE_LIST_STRATEGIES = ("envvar", "cdi-cri")
# NVIDIA's MIG strategies, mapped onto gpuslice's resources (deviceplugin/migstrategy.py).
MIG_STRATEGIES = ("none", "single", "mixed")
OVERUSE_POLICIES = ("warn", "evict", "kill")
DEFAULT_IGNORED_XIDS = (13, 31, 43, 45, 68, 109)
# GPU nodes are commonly tainted nvidia.com/gpu:NoSchedule; Kubernetes adds the matching toleration
# only to pods that request nvidia.com/gpu (ExtendedResourceToleration), which converted pods no
# longer do, so the webhook adds it (issue 14).
DEFAULT_CONVERTED_POD_TOLERATIONS: tuple[dict[str, Any], ...] = (
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
)
TOLERATION_OPERATORS = ("Exists", "Equal")
TAINT_EFFECTS = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")
_TOLERATION_KEYS = frozenset({"key", "operator", "value", "effect", "tolerationSeconds"})
# A label key: an optional DNS-subdomain prefix and "/", then a name of at most 63 characters.
_QUALIFIED_NAME_RE = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)

_PREFIX_RE = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$")
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_OBJECT_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class ConfigError(ValueError):
    """A configuration value is missing, of the wrong type or out of range."""


class UnknownNodeConfig(ConfigError):
    """The node configuration asked for is not among the file's `nodeConfigs`."""

    def __init__(self, name: str, known: Sequence[str]) -> None:
        self.name = name
        self.known = tuple(known)
        listed = ", ".join(self.known) if self.known else "none: the file has no nodeConfigs"
        super().__init__(f"nodeConfigs has no entry {name!r} (known: {listed})")


@dataclasses.dataclass(frozen=True)
class MpsConfig:
    enabled: bool = False
    pipe_directory: str = "/run/nvidia/mps/pipe"
    # Where the pipe directory appears inside containers.
    container_pipe_directory: str = "/run/nvidia/mps/pipe"
    # Host directory shared as /dev/shm by the MPS daemon and its clients (RAM-backed under /run).
    shm_directory: str = "/run/nvidia/mps/shm"


@dataclasses.dataclass(frozen=True)
class HealthConfig:
    enabled: bool = True
    ignored_xids: tuple[int, ...] = DEFAULT_IGNORED_XIDS
    # How often an unhealthy GPU is probed through NVML to see if it has recovered.
    recovery_interval_seconds: float = 30.0
    event_timeout_ms: int = 5000


@dataclasses.dataclass(frozen=True)
class SteeringConfig:
    """Node labels that let the stock scheduler see per-GPU free memory (issue 6)."""

    enabled: bool = True
    # Minimum seconds between two label writes of one node that only give back (releases, score):
    # what a pod takes is written at once (deviceplugin/labels.py over_promises).
    label_min_interval_seconds: float = 2.0
    # How often the plugin re-reads kubelet's PodResources List to notice released devices.
    pod_resources_poll_seconds: float = 5.0
    # Webhook: give pods that ask for no device a preference for nodes without a fully free GPU,
    # so their CPU does not strand whole GPUs (docs/steering.md, "Pods without a GPU").
    cpu_pods: bool = True
    # Webhook, with cpu_pods: among nodes without a fully free GPU, pods that ask for no device
    # prefer those with less GPU memory than this free (MiB), whose CPU the pods still to come can
    # use least (docs/steering.md, "Nodes with little GPU memory left first"). 0: off.
    cpu_pods_nearly_full_mib: int = 8192
    # ... while pods that ask for no device ask more than this percentage of the CPU of the pods
    # the webhook admits (webhook/cpudemand.py): where they ask less, the band costs more than it
    # gains. 0: always.
    cpu_pods_nearly_full_cpu_percent: int = 25
    # CPU (millicores) one GPU's pods are expected to ask for. The plugin publishes each node's CPU
    # beyond that per free GPU (or short of it), and the webhook prefers for a GPU pod the nodes
    # whose CPU left after it still matches their free GPUs (docs/steering.md, "CPU beside the
    # GPUs"). 0: neither.
    cpu_per_gpu_milli: int = 12000


@dataclasses.dataclass(frozen=True)
class MonitorConfig:
    """What pods really use on the node's GPUs, and what happens when one uses more than its
    grant (issue 15; docs/isolation.md)."""

    enabled: bool = True
    # Seconds between two NVML samples of every GPU and its processes.
    interval_seconds: float = 10.0
    # What an over-use leads to, after the Event: warn (nothing more), evict (Eviction API) or kill.
    overuse_policy: str = "warn"
    # MiB a container may use above its grant before it counts as over-use.
    overuse_tolerance_mib: int = 256
    # Seconds a container must stay over its grant (plus tolerance) before it is an over-use.
    overuse_seconds: float = 30.0


@dataclasses.dataclass(frozen=True)
class DraConfig:
    """DRA mode (docs/dra.md): the kubelet DRA plugin and the webhook's ResourceClaims."""

    # Webhook: turn the annotations into ResourceClaims of the DRA driver instead of extended resources.
    enabled: bool = False
    # DRA plugin: minimum seconds between two ResourceSlice writes (changes in between coalesce).
    slice_min_interval_seconds: float = 2.0
    # DRA plugin: seconds between full comparisons of the published slices with the wanted ones
    # (repairs slices someone else changed or deleted).
    slice_resync_seconds: float = 300.0


@dataclasses.dataclass(frozen=True)
class RequeueConfig:
    """Controller: recreate converted bare pods that kubelet refused (controller/requeue.py)."""

    enabled: bool = True
    # Recreations of one pod before it is left Failed.
    max_attempts: int = 5
    # Wait before the first recreation; doubled for each later one.
    backoff_seconds: float = 1.0


@dataclasses.dataclass(frozen=True)
class PacingConfig:
    """Scheduling gates on converted pods, released by the controller's pacer (pacer/; docs/steering.md, "Pacing")."""

    # Webhook: gate every converted device-plugin pod while a controller leads (controller.lease*).
    # Device plugin: write every allocation to the labels at once (the pacer waits for them).
    enabled: bool = False
    # Controller: released pods the scheduler has not yet bound (nor found unschedulable) at any moment;
    # each goes only where it cannot race the others (pacer/room.py).
    max_in_flight: int = 32
    # Controller: seconds a released pod counts as in flight at most, bound or not.
    bind_timeout_seconds: float = 10.0
    # Controller: seconds a node may lag before the pacer stops waiting for it (a node whose kubelet does not
    # admit what is bound to it, e.g. NotReady, would otherwise hold back every pod that could go there).
    lag_timeout_seconds: float = 10.0


@dataclasses.dataclass(frozen=True)
class ControllerConfig:
    """The controller's leader election (controller/; docs/architecture.md, "The controller")."""

    # The coordination.k8s.io Lease its replicas elect a leader with; the leader alone requeues
    # and paces, and renews it. Webhook, with pacing on: gates pods only while it is renewed (a
    # controller that is down must not leave every new pod waiting).
    lease_name: str = "gpuslice-controller"
    # The Lease's namespace; "" is the pod's own (POD_NAMESPACE, else "default").
    lease_namespace: str = ""
    # Seconds a renewal holds: a standby takes over once the leader's last renewal is this old (the
    # leader renews every third of it); the webhook gates no more past it.
    lease_seconds: int = 15

    def lease_namespace_in(self, environ: Mapping[str, str]) -> str:
        """The Lease's namespace: `lease_namespace`, else the pod's own (POD_NAMESPACE), else "default"."""
        return self.lease_namespace or environ.get("POD_NAMESPACE") or "default"


@dataclasses.dataclass(frozen=True)
class WebhookConfig:
    """Bounds on the webhook's HTTPS connections (issue 13.1; docs/webhook.md, "Connections")."""

    # Seconds a connection may wait for its next request, headers included, before it is closed.
    # Longer than the 90 s kube-apiserver's client keeps an idle connection, so the client closes first.
    idle_timeout_seconds: float = 120.0
    # Seconds after it is accepted within which a connection must have sent its first request's
    # headers, else it is closed: clients that connect and send nothing hold no place for long.
    first_request_timeout_seconds: float = 10.0
    # Seconds a request's body may take to arrive once its headers have.
    body_timeout_seconds: float = 10.0
    # Seconds a TLS handshake may take.
    tls_handshake_timeout_seconds: float = 10.0
    # Seconds after which a connection is closed once its current request is answered.
    max_connection_age_seconds: float = 600.0
    # Connections served at once; one more closes the one idle the longest (503 if none is idle).
    max_connections: int = 1000


@dataclasses.dataclass(frozen=True)
class Config:
    resource_prefix: str = contract.DEFAULT_PREFIX
    memory_unit_mib: int = contract.DEFAULT_UNIT_MIB
    device_list_strategy: str = "envvar"
    # Mixed is what the plugin always did: MIG devices as <prefix>/mig-<profile>, other GPUs as units.
    mig_strategy: str = "mixed"
    cdi_kind: str = "nvidia.com/gpu"
    mps: MpsConfig = MpsConfig()
    health: HealthConfig = HealthConfig()
    steering: SteeringConfig = SteeringConfig()
    monitor: MonitorConfig = MonitorConfig()
    dra: DraConfig = DraConfig()
    requeue: RequeueConfig = RequeueConfig()
    pacing: PacingConfig = PacingConfig()
    controller: ControllerConfig = ControllerConfig()
    webhook: WebhookConfig = WebhookConfig()
    # Webhook: GPU memory assumed for gpu-fraction when it has no view of the cluster's nodes.
    default_gpu_memory_mib: int = 81920
    # On by default: on nodes gpuslice serves nothing else advertises nvidia.com/gpu, so a plain
    # `nvidia.com/gpu: N` pod would otherwise stay Pending. Off where NVIDIA's plugin serves other nodes.
    convert_whole_gpus: bool = True
    ignored_namespaces: tuple[str, ...] = ("kube-system",)
    # Webhook: schedulerName set on converted pods ("" leaves it; "gpuslice-binpack" with the chart's profile).
    scheduler_name: str = ""
    # Webhook: tolerations added to every converted pod that does not already tolerate them.
    converted_pod_tolerations: tuple[dict[str, Any], ...] = DEFAULT_CONVERTED_POD_TOLERATIONS
    # The names of the file's nodeConfigs, and the one layered into this Config ("" for none).
    node_config_names: tuple[str, ...] = ()
    node_config: str = ""

    @functools.cached_property
    def contract(self) -> contract.Contract:
        # Built once per Config (the fields are frozen): the webhook reads it several times per admission.
        return contract.Contract(prefix=self.resource_prefix, unit_mib=self.memory_unit_mib)


# --- the schema ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Field:
    path: str  # YAML path, dotted: "mps.enabled"
    attr: str  # Config attribute path, dotted: "mps.enabled"
    kind: type  # bool, int, float, str or tuple (list of ints/strings)
    check: Callable[[Any], str | None]  # returns what is wrong, or None
    help: str
    item: type = str  # element type for tuples

    @property
    def flag(self) -> str:
        words = re.sub(r"([a-z0-9])([A-Z])", r"\1-\2", self.path.replace(".", "-"))
        return "--" + words.lower().replace("mi-b", "mib")

    @property
    def env(self) -> str:
        return "GPUSLICE_" + self.flag[2:].replace("-", "_").upper()

    @property
    def dest(self) -> str:
        return "cfg_" + self.attr.replace(".", "__")


def _positive(value: Any) -> str | None:
    return None if value > 0 else "must be greater than 0"


def _one_of(*choices: str) -> Callable[[Any], str | None]:
    return lambda value: None if value in choices else "must be one of " + ", ".join(choices)


def _not_negative(value: Any) -> str | None:
    return None if value >= 0 else "must be 0 or more"


def _cpu_per_gpu(value: Any) -> str | None:
    # A node's balance label is its free CPU less this per free GPU: beyond a thousand cores per
    # GPU it is a typo, and such values would no longer fit the labels' and terms' 64-bit numbers.
    return None if 0 <= value <= MAX_CPU_PER_GPU_MILLI else f"must be 0 to {MAX_CPU_PER_GPU_MILLI}"


MAX_CPU_PER_GPU_MILLI = 1_000_000


def _nearly_full(value: Any) -> str | None:
    # Compared with a node's free-units label (64-bit in a node selector): a few nodes' worth of
    # GPU memory is already "every node", so anything past 1 PiB is a typo.
    return None if 0 <= value <= MAX_NEARLY_FULL_MIB else f"must be 0 to {MAX_NEARLY_FULL_MIB}"


MAX_NEARLY_FULL_MIB = 2**30  # 1 PiB


def _percent(value: Any) -> str | None:
    return None if 0 <= value <= 100 else "must be 0 to 100"


def _reserved_domain(prefix: str) -> str | None:
    """The Kubernetes domain `prefix` falls in, if any. Kubelet reads any resource name containing
    "kubernetes.io/" as native and refuses to advertise it (so "examplekubernetes.io" too), and
    NodeRestriction keeps node agents from writing labels under kubernetes.io and k8s.io."""
    if prefix.endswith("kubernetes.io"):
        return "kubernetes.io"
    if prefix == "k8s.io" or prefix.endswith(".k8s.io"):
        return "k8s.io"
    return None


def _prefix(value: str) -> str | None:
    if not _PREFIX_RE.match(value):
        return "must be a DNS subdomain such as gpuslice.io (lower case, at least one dot)"
    reserved = _reserved_domain(value)
    if reserved is not None:
        return f"{value!r} is in the {reserved} domain, which Kubernetes reserves: use a domain of your own"
    if value.startswith("requests."):
        return "must not start with 'requests.' (Kubernetes reads requests.<name> as a quota, not a resource)"
    return None


def _absolute(value: str) -> str | None:
    return None if value.startswith("/") else "must be an absolute path"


def _namespaces(values: tuple[str, ...]) -> str | None:
    bad = [v for v in values if not _DNS_LABEL_RE.match(v)]
    return f"{bad[0]!r} is not a namespace name" if bad else None


def _xids(values: tuple[int, ...]) -> str | None:
    bad = [v for v in values if v <= 0]
    return f"XID {bad[0]} is not a positive integer" if bad else None


def _scheduler_name(value: str) -> str | None:
    return None if value == "" or _PREFIX_RE.match(value) or _DNS_LABEL_RE.match(value) else "is not a valid name"


def _cdi_kind(value: str) -> str | None:
    vendor, sep, cls = value.partition("/")
    return None if sep and vendor and cls else "must be <vendor>/<class>, e.g. nvidia.com/gpu"


def _dns_subdomain(value: str) -> str | None:
    ok = len(value) <= 253 and _OBJECT_NAME_RE.match(value)
    return None if ok else "must be a Kubernetes object name (lower case letters, digits, '-' and '.')"


def _namespace_or_empty(value: str) -> str | None:
    return None if value == "" or _DNS_LABEL_RE.match(value) else f"{value!r} is not a namespace name"


def _always_ok(value: Any) -> str | None:
    return None


def _tolerations(values: tuple[dict[str, Any], ...]) -> str | None:
    """Each entry a Kubernetes toleration the API server would accept."""
    for index, entry in enumerate(values):
        where = f"entry {index}"
        unknown = sorted(set(entry) - _TOLERATION_KEYS)
        if unknown:
            return f"{where} has unknown field {unknown[0]!r} (known: {', '.join(sorted(_TOLERATION_KEYS))})"
        key, operator = entry.get("key", ""), entry.get("operator", "Equal")
        value, effect = entry.get("value", ""), entry.get("effect", "")
        seconds = entry.get("tolerationSeconds")
        if not all(isinstance(v, str) for v in (key, operator, value, effect)):
            return f"{where}: key, operator, value and effect must be strings"
        if key and not _QUALIFIED_NAME_RE.match(key):
            return f"{where}: key {key!r} is not a valid label key"
        if operator not in TOLERATION_OPERATORS:
            return f"{where}: operator must be one of {', '.join(TOLERATION_OPERATORS)}, got {operator!r}"
        if operator == "Exists" and value:
            return f"{where}: operator Exists takes no value"
        if not key and operator != "Exists":
            return f"{where}: without a key the operator must be Exists"
        if effect not in TAINT_EFFECTS:
            return f"{where}: effect must be one of {', '.join(repr(e) for e in TAINT_EFFECTS)}, got {effect!r}"
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int)):
            return f"{where}: tolerationSeconds must be an integer"
        if seconds is not None and effect != "NoExecute":
            return f"{where}: tolerationSeconds needs effect NoExecute"
    return None


FIELDS: tuple[Field, ...] = (
    Field("resourcePrefix", "resource_prefix", str, _prefix, "prefix of every resource, label and annotation"),
    Field("memoryUnitMiB", "memory_unit_mib", int, _positive, "MiB of GPU memory per advertised device"),
    Field(
        "deviceListStrategy",
        "device_list_strategy",
        str,
        _one_of(*DEVICE_LIST_STRATEGIES),
        "how a container is given its GPU: envvar (NVIDIA_VISIBLE_DEVICES) or cdi-cri (CDI devices)",
    ),
    Field("cdiKind", "cdi_kind", str, _cdi_kind, "CDI kind of the GPU devices for cdi-cri"),
    Field(
        "migStrategy",
        "mig_strategy",
        str,
        _one_of(*MIG_STRATEGIES),
        "device plugin: how MIG devices are advertised: mixed (one mig-<profile> resource per profile), "
        "single (every GPU in MIG mode with one profile; each MIG device shared as gpu-memory units) or "
        "none (MIG-mode GPUs left out)",
    ),
    Field("mps.enabled", "mps.enabled", bool, _always_ok, "give each container a per-pod MPS memory and SM limit"),
    Field("mps.pipeDirectory", "mps.pipe_directory", str, _absolute, "host directory of the MPS control pipe"),
    Field(
        "mps.containerPipeDirectory",
        "mps.container_pipe_directory",
        str,
        _absolute,
        "where the MPS pipe directory is mounted in containers",
    ),
    Field(
        "mps.shmDirectory",
        "mps.shm_directory",
        str,
        _absolute,
        "host directory the MPS daemon and its clients share as /dev/shm",
    ),
    Field("health.enabled", "health.enabled", bool, _always_ok, "watch NVML XID events"),
    Field(
        "health.ignoredXids",
        "health.ignored_xids",
        tuple,
        _xids,
        "XIDs that do not mark a GPU unhealthy (application errors)",
        item=int,
    ),
    Field(
        "health.recoveryIntervalSeconds",
        "health.recovery_interval_seconds",
        float,
        _positive,
        "seconds between NVML probes of an unhealthy GPU",
    ),
    Field("health.eventTimeoutMs", "health.event_timeout_ms", int, _positive, "NVML event wait timeout"),
    Field("steering.enabled", "steering.enabled", bool, _always_ok, "publish and use the steering node labels"),
    Field(
        "steering.labelMinIntervalSeconds",
        "steering.label_min_interval_seconds",
        float,
        _positive,
        "minimum seconds between two label writes of a node that only give back (what pods take is written at once)",
    ),
    Field(
        "steering.podResourcesPollSeconds",
        "steering.pod_resources_poll_seconds",
        float,
        _positive,
        "seconds between reads of kubelet's PodResources List",
    ),
    Field(
        "steering.cpuPods",
        "steering.cpu_pods",
        bool,
        _always_ok,
        "prefer nodes without a fully free GPU for pods that ask for no device",
    ),
    Field(
        "steering.cpuPodsNearlyFullMiB",
        "steering.cpu_pods_nearly_full_mib",
        int,
        _nearly_full,
        "with cpuPods: prefer, among nodes without a fully free GPU, those with less free GPU memory than this, "
        "the least first (MiB; 0: off)",
    ),
    Field(
        "steering.cpuPodsNearlyFullCpuPercent",
        "steering.cpu_pods_nearly_full_cpu_percent",
        int,
        _percent,
        "with cpuPodsNearlyFullMiB: only while pods asking for no device ask more than this percentage of"
        " the CPU admitted (0: always)",
    ),
    Field(
        "steering.cpuPerGpuMilli",
        "steering.cpu_per_gpu_milli",
        int,
        _cpu_per_gpu,
        "CPU millicores expected per GPU: GPU pods prefer nodes whose CPU left matches their free GPUs (0: off)",
    ),
    Field("monitor.enabled", "monitor.enabled", bool, _always_ok, "sample per-pod GPU memory use from NVML"),
    Field(
        "monitor.intervalSeconds",
        "monitor.interval_seconds",
        float,
        _positive,
        "seconds between two samples of the GPUs and their processes",
    ),
    Field(
        "monitor.overusePolicy",
        "monitor.overuse_policy",
        str,
        _one_of(*OVERUSE_POLICIES),
        "what follows the Event when a container uses more GPU memory than granted: warn, evict or kill",
    ),
    Field(
        "monitor.overuseToleranceMiB",
        "monitor.overuse_tolerance_mib",
        int,
        _not_negative,
        "MiB a container may use above its grant before it counts as over-use",
    ),
    Field(
        "monitor.overuseSeconds",
        "monitor.overuse_seconds",
        float,
        _positive,
        "seconds a container must stay above its grant before it is an over-use",
    ),
    Field(
        "defaultGpuMemoryMiB",
        "default_gpu_memory_mib",
        int,
        _positive,
        "GPU memory assumed for gpu-fraction when the webhook has no cluster view",
    ),
    Field(
        "convertWholeGpus",
        "convert_whole_gpus",
        bool,
        _always_ok,
        "turn plain nvidia.com/gpu requests into whole GPUs of memory units",
    ),
    Field(
        "ignoredNamespaces",
        "ignored_namespaces",
        tuple,
        _namespaces,
        "namespaces whose pods the webhook leaves alone",
    ),
    Field("schedulerName", "scheduler_name", str, _scheduler_name, "schedulerName set on converted pods"),
    Field(
        "convertedPodTolerations",
        "converted_pod_tolerations",
        tuple,
        _tolerations,
        "webhook: tolerations added to every converted pod not already tolerating them (a JSON list in a flag "
        "or environment variable)",
        item=dict,
    ),
    Field(
        "dra.enabled",
        "dra.enabled",
        bool,
        _always_ok,
        "webhook: turn the annotations into ResourceClaims of the DRA driver (DRA mode)",
    ),
    Field(
        "dra.sliceMinIntervalSeconds",
        "dra.slice_min_interval_seconds",
        float,
        _positive,
        "DRA plugin: minimum seconds between two ResourceSlice writes",
    ),
    Field(
        "dra.sliceResyncSeconds",
        "dra.slice_resync_seconds",
        float,
        _positive,
        "DRA plugin: seconds between full checks of the published ResourceSlices",
    ),
    Field(
        "requeue.enabled",
        "requeue.enabled",
        bool,
        _always_ok,
        "controller: recreate converted pods without a controller that kubelet refused",
    ),
    Field(
        "requeue.maxAttempts",
        "requeue.max_attempts",
        int,
        _positive,
        "controller: recreations of one refused pod before it is left Failed",
    ),
    Field(
        "requeue.backoffSeconds",
        "requeue.backoff_seconds",
        float,
        _positive,
        "controller: wait before the first recreation of a refused pod (doubled each time)",
    ),
    Field(
        "pacing.enabled",
        "pacing.enabled",
        bool,
        _always_ok,
        "webhook: gate converted pods for the controller to release, while it leads; device plugin: "
        "write every allocation to the labels at once",
    ),
    Field(
        "pacing.maxInFlight",
        "pacing.max_in_flight",
        int,
        _positive,
        "controller: released pods not yet bound or found unschedulable, at most",
    ),
    Field(
        "pacing.bindTimeoutSeconds",
        "pacing.bind_timeout_seconds",
        float,
        _positive,
        "controller: seconds a released pod counts as in flight at most",
    ),
    Field(
        "pacing.lagTimeoutSeconds",
        "pacing.lag_timeout_seconds",
        float,
        _positive,
        "controller: seconds a node's labels may lag its bound pods before the pacer stops waiting for them",
    ),
    Field(
        "controller.leaseName",
        "controller.lease_name",
        str,
        _dns_subdomain,
        "controller: the coordination.k8s.io Lease its replicas elect a leader with (the leader requeues "
        "and paces); webhook: with pacing on, gates pods only while that Lease is renewed",
    ),
    Field(
        "controller.leaseNamespace",
        "controller.lease_namespace",
        str,
        _namespace_or_empty,
        "controller and webhook: the Lease's namespace (empty: their own, from POD_NAMESPACE, else default)",
    ),
    Field(
        "controller.leaseSeconds",
        "controller.lease_seconds",
        int,
        _positive,
        "controller: seconds a renewal holds (renewed every third of it; a standby takes over after it); "
        "webhook: pods are no longer gated once the last renewal is older",
    ),
    Field(
        "webhook.idleTimeoutSeconds",
        "webhook.idle_timeout_seconds",
        float,
        _positive,
        "webhook: seconds a connection may wait for its next request (headers included) before it is closed",
    ),
    Field(
        "webhook.firstRequestTimeoutSeconds",
        "webhook.first_request_timeout_seconds",
        float,
        _positive,
        "webhook: seconds after it is accepted a connection may take to send its first request's headers "
        "(TLS handshake included) before it is closed",
    ),
    Field(
        "webhook.bodyTimeoutSeconds",
        "webhook.body_timeout_seconds",
        float,
        _positive,
        "webhook: seconds a request body may take to arrive",
    ),
    Field(
        "webhook.tlsHandshakeTimeoutSeconds",
        "webhook.tls_handshake_timeout_seconds",
        float,
        _positive,
        "webhook: seconds a TLS handshake may take",
    ),
    Field(
        "webhook.maxConnectionAgeSeconds",
        "webhook.max_connection_age_seconds",
        float,
        _positive,
        "webhook: seconds after which a connection is closed once its current request is answered",
    ),
    Field(
        "webhook.maxConnections",
        "webhook.max_connections",
        int,
        _positive,
        "webhook: connections served at once (one more closes the one idle the longest; 503 when none is idle)",
    ),
)

_BY_PATH = {f.path: f for f in FIELDS}
_SECTIONS = {f.path.split(".")[0] for f in FIELDS if "." in f.path}

NODE_CONFIGS_KEY = "nodeConfigs"
# Keys a named node configuration may set: read only by the device plugin on its node, and
# needing nothing the chart grants to every plugin pod alike. Why each other key may not differ
# between nodes is in `_NOT_PER_NODE` (docs/configuration.md, "Per-node configuration").
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
_NOT_PER_NODE = (
    (
        ("resourcePrefix", "memoryUnitMiB", "steering.enabled", "steering.cpuPerGpuMilli"),
        "the webhook reads it too, with one value for the whole cluster",
    ),
    (
        ("mps.", "monitor.enabled", "monitor.overusePolicy"),
        "the chart grants what it needs (MPS daemon, host /proc, hostPID, eviction rights) to every plugin pod alike",
    ),
    (("dra.",), "the DRA plugin does not read node configurations"),
)
# A node configuration's name is a label value: at most 63 characters, alphanumeric at both ends.
_NODE_CONFIG_NAME_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


# --- parsing ------------------------------------------------------------------------------

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def _coerce(field: Field, value: Any, source: str) -> Any:
    """Turn a YAML value or a string (flag, env) into the field's type, or raise ConfigError."""

    def fail(expected: str) -> ConfigError:
        return ConfigError(f"{field.path}: {expected}, got {value!r} (from {source})")

    if field.kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
        raise fail("must be true or false")
    if field.kind is int:
        if isinstance(value, bool):
            raise fail("must be an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
            return int(value)
        raise fail("must be an integer")
    if field.kind is float:
        if isinstance(value, bool):
            raise fail("must be a number")
        if isinstance(value, (int, float)):
            return float(value)
        try:
            return float(value)
        except (TypeError, ValueError):
            raise fail("must be a number") from None
    if field.kind is str:
        if isinstance(value, str):
            return value
        raise fail("must be a string")
    if field.kind is tuple and field.item is dict:  # a list of objects; JSON from a flag or environment
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise fail("must be a JSON list of objects") from None
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, Mapping) for v in value):
            raise fail("must be a list of objects")
        return tuple(dict(v) for v in value)
    if field.kind is tuple:
        items = value.split(",") if isinstance(value, str) else value
        if isinstance(value, str) and not value.strip():
            items = []
        if not isinstance(items, (list, tuple)):
            raise fail("must be a list")
        sub = Field(field.path, field.attr, field.item, _always_ok, field.help)
        return tuple(_coerce(sub, v.strip() if isinstance(v, str) else v, source) for v in items)
    raise AssertionError(field.kind)


def _flatten(document: Mapping[str, Any], source: str) -> dict[str, Any]:
    """YAML mapping -> {dotted path: raw value}; unknown keys are errors with a suggestion."""
    flat: dict[str, Any] = {}
    for key, value in document.items():
        if key == NODE_CONFIGS_KEY:
            continue  # read by _node_configs
        if key == "version":
            if value != SCHEMA_VERSION:
                raise ConfigError(f"version: must be {SCHEMA_VERSION!r}, got {value!r} (from {source})")
            continue
        if key in _SECTIONS:
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise ConfigError(f"{key}: must be a mapping, got {value!r} (from {source})")
            for sub, subvalue in value.items():
                path = f"{key}.{sub}"
                if path not in _BY_PATH:
                    raise ConfigError(_unknown(path, source))
                flat[path] = subvalue
        elif key in _BY_PATH:
            flat[key] = value
        else:
            raise ConfigError(_unknown(str(key), source))
    return flat


def _unknown(path: str, source: str) -> str:
    hint = difflib.get_close_matches(path, list(_BY_PATH) + ["version", NODE_CONFIGS_KEY], n=1)
    suggestion = f" (did you mean {hint[0]}?)" if hint else ""
    return f"{path}: unknown key{suggestion} (from {source}); known keys: version, {NODE_CONFIGS_KEY}, " + ", ".join(
        _BY_PATH
    )


def _node_configs(document: Mapping[str, Any], source: str) -> dict[str, dict[str, Any]]:
    """The file's nodeConfigs, each entry flattened, typed and checked like the file itself and
    held to PER_NODE_KEYS: a bad entry stops every component, not only the node that picks it."""
    raw = document.get(NODE_CONFIGS_KEY)
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{NODE_CONFIGS_KEY}: must be a mapping of names to partial configurations (from {source})")
    entries: dict[str, dict[str, Any]] = {}
    for name, entry in raw.items():
        where = f"{NODE_CONFIGS_KEY}.{name}"
        if not isinstance(name, str) or not _NODE_CONFIG_NAME_RE.match(name):
            raise ConfigError(
                f"{NODE_CONFIGS_KEY}: {name!r} is not a valid name: a label value (at most 63 letters, digits, "
                f"'-', '_' or '.', alphanumeric at both ends), since the node label selects it (from {source})"
            )
        if entry is None:
            entry = {}
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where}: must be a mapping of configuration keys, got {entry!r} (from {source})")
        if "version" in entry:
            raise ConfigError(f"{where}.version: an entry has no version of its own (from {source})")
        values: dict[str, Any] = {}
        for path, value in _flatten(entry, f"{source}, {where}").items():
            if path not in PER_NODE_KEYS:
                reason = next(
                    (why for keys, why in _NOT_PER_NODE if path.startswith(keys)), "only the webhook reads it"
                )
                raise ConfigError(
                    f"{where}.{path}: cannot differ between nodes: {reason}; a node configuration may set "
                    + ", ".join(PER_NODE_KEYS)
                )
            field = _BY_PATH[path]
            values[path] = _coerce(field, value, f"{source}, {where}")
            problem = field.check(values[path])
            if problem:
                raise ConfigError(f"{where}.{path}: {problem}, got {values[path]!r}")
        entries[name] = values
    return entries


def _read_file(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    source = str(path)
    try:
        text = pathlib.Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {source}: {exc.strerror}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"configuration file {source} is not valid YAML: {exc}") from None
    if document is None:
        return {}, {}
    if not isinstance(document, Mapping):
        raise ConfigError(f"configuration file {source} must hold a mapping, not {type(document).__name__}")
    return _flatten(document, source), _node_configs(document, source)


def load(
    file: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    args: argparse.Namespace | None = None,
    overrides: Mapping[str, Any] | None = None,
    node_config: str = "",
) -> Config:
    """Build the Config: `overrides` (YAML paths) > flags in `args` > environment > the file's
    `nodeConfigs` entry `node_config` ("" for none; UnknownNodeConfig when absent) > file > defaults."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    node_configs: dict[str, dict[str, Any]] = {}
    if file is not None:
        flat, node_configs = _read_file(file)
        for path, raw in flat.items():
            values[path] = _coerce(_BY_PATH[path], raw, f"file {file}")
    if node_config:
        if node_config not in node_configs:
            raise UnknownNodeConfig(node_config, sorted(node_configs))
        values.update(node_configs[node_config])
    for field in FIELDS:
        if field.env in environ:
            values[field.path] = _coerce(field, environ[field.env], f"environment {field.env}")
    if args is not None:
        for field in FIELDS:
            raw = getattr(args, field.dest, None)
            if raw is not None:
                values[field.path] = _coerce(field, raw, f"flag {field.flag}")
    for path, raw in (overrides or {}).items():
        if path not in _BY_PATH:
            raise ConfigError(_unknown(path, "overrides"))
        values[path] = _coerce(_BY_PATH[path], raw, "overrides")
    for path, value in values.items():
        problem = _BY_PATH[path].check(value)
        if problem:
            raise ConfigError(f"{path}: {problem}, got {value!r}")
    if values.get("pacing.enabled") and values.get("dra.enabled"):
        raise ConfigError(
            "pacing.enabled: needs device-plugin mode, but dra.enabled is true (in DRA mode the scheduler "
            "allocates from ResourceSlices, never by node labels that lag: there is nothing to pace)"
        )
    return dataclasses.replace(_build(values), node_config_names=tuple(sorted(node_configs)), node_config=node_config)


def _build(values: Mapping[str, Any]) -> Config:
    top: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for path, value in values.items():
        attr = _BY_PATH[path].attr
        if "." in attr:
            section, name = attr.split(".", 1)
            nested.setdefault(section, {})[name] = value
        else:
            top[attr] = value
    base = Config()
    for section, fields in nested.items():
        top[section] = dataclasses.replace(getattr(base, section), **fields)
    return dataclasses.replace(base, **top)


# Keys only one half reads. A component's --help shows the flags of the keys it reads; its file and
# environment still accept the whole schema (one file can configure every component). Keys in
# neither tuple are read by both halves.
_NODE_KEYS = (
    "deviceListStrategy",
    "cdiKind",
    "migStrategy",
    "mps.",
    "health.",
    "monitor.",
    "steering.labelMinIntervalSeconds",
    "steering.podResourcesPollSeconds",
    "dra.slice",
)
_WEBHOOK_KEYS = (
    "defaultGpuMemoryMiB",
    "convertWholeGpus",
    "convertedPodTolerations",
    "ignoredNamespaces",
    "schedulerName",
    "steering.cpuPods",
    "dra.enabled",
    "controller.lease",
    "webhook.",
)
# Read by the controller alone: the requeuer and the pacer (of pacing, the webhook and the device
# plugin read `enabled`; the webhook reads the controller's Lease to know whether to gate).
_CONTROLLER_ONLY_KEYS = ("requeue.", "pacing.maxInFlight", "pacing.bindTimeoutSeconds", "pacing.lagTimeoutSeconds")
# The controller reads the names (prefix, unit size) and its own sections.
_CONTROLLER_KEYS = ("resourcePrefix", "memoryUnitMiB", "requeue.", "pacing.", "controller.")
COMPONENTS = ("webhook", "device-plugin", "dra-plugin", "controller")


def reads(component: str | None, field: Field) -> bool:
    """Whether `component` reads `field` (None: every component, e.g. the simulator and the demo,
    which run both halves)."""
    if component is None:
        return True
    if component not in COMPONENTS:
        raise ValueError(f"unknown component {component!r}; known: {', '.join(COMPONENTS)}")
    if component == "controller":
        return field.path.startswith(_CONTROLLER_KEYS)
    if field.path.startswith(_CONTROLLER_ONLY_KEYS):
        return False
    node_only = field.path.startswith(_NODE_KEYS)
    webhook_only = field.path.startswith(_WEBHOOK_KEYS)
    if component == "webhook":
        return not node_only
    if component == "device-plugin" and field.path.startswith("dra."):
        return False
    return not webhook_only


def add_arguments(parser: argparse.ArgumentParser, component: str | None = None) -> None:
    """Add `--config` and one flag per schema key that `component` reads (all optional; unset flags
    do not override)."""
    parser.add_argument("--config", metavar="FILE", help="YAML configuration file (schema: docs/configuration.md)")
    group = parser.add_argument_group("configuration (flag > environment > file)")
    for field in FIELDS:
        if not reads(component, field):
            continue
        metavar = "BOOL" if field.kind is bool else "LIST" if field.kind is tuple else field.kind.__name__.upper()
        group.add_argument(field.flag, dest=field.dest, metavar=metavar, help=f"{field.help} [{field.env}]")


def from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None, *, node_config: str = "") -> Config:
    """The Config for a parsed command line made with `add_arguments` (and the file's node
    configuration `node_config`, if not "")."""
    environ = os.environ if environ is None else environ
    file = args.config or environ.get("GPUSLICE_CONFIG") or None
    return load(file, environ=environ, args=args, node_config=node_config)


def describe(fields: Sequence[Field] = FIELDS) -> str:
    """A Markdown table of the schema, for docs/configuration.md."""
    defaults = Config()
    rows = ["| key | flag | environment | default | meaning |", "|---|---|---|---|---|"]
    for field in fields:
        value: Any = defaults
        for part in field.attr.split("."):
            value = getattr(value, part)
        if isinstance(value, tuple) and field.item is dict:
            value = json.dumps(list(value), separators=(", ", ": "))
        elif isinstance(value, tuple):
            value = "[" + ", ".join(map(str, value)) + "]"
        elif isinstance(value, bool):
            value = str(value).lower()
        rows.append(f"| `{field.path}` | `{field.flag}` | `{field.env}` | `{value}` | {field.help} |")
    return "\n".join(rows)
