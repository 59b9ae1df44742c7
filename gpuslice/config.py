"""The one configuration schema shared by the webhook, the device plugin, the DRA plugin and the controller.

Sources, highest first: command-line flag > environment variable > named node configuration >
YAML file > default. Every key is declared once, as a field of its section's frozen dataclass:
`memory_unit_mib: int = key(256, "help", check=_positive)` gives its type (the annotation), its
default, its check and its help; its YAML name is the field's name in camelCase with "MiB" for
"mib" (`memoryUnitMiB`, `mps.pipeDirectory`). `FIELDS` is built from these declarations, and from
it come the flags (`--memory-unit-mib`), the environment variables (`GPUSLICE_MEMORY_UNIT_MIB`) and
the table in docs/configuration.md (`describe()`; tests/core/test_config_docs.py keeps them equal).

Each section says which components read it (`READ_BY`), and a key may say otherwise where a
section is shared; a component's `--help` lists the flags of the keys it reads (`reads()`).

The file may hold `nodeConfigs`: named partial configurations of the keys that only the node
plugins read and that no section or key marks `not_per_node` (`PER_NODE_KEYS`), of which a node
picks one with its `<prefix>/config` label (the device plugin reads the label; `load(node_config=...)`
layers the entry over the file). Every entry is validated whenever the file is loaded, by every
component, whichever entry a node picks.

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
from typing import Any, ClassVar, TypeVar

import yaml

from gpuslice import contract

__all__ = [
    "Config",
    "MpsConfig",
    "HealthConfig",
    "SteeringConfig",
    "MonitorConfig",
    "DraConfig",
    "RequeueConfig",
    "PacingConfig",
    "ControllerConfig",
    "WebhookConfig",
    "MIG_STRATEGIES",
    "COMPONENTS",
    "ConfigError",
    "UnknownNodeConfig",
    "PER_NODE_KEYS",
    "FIELDS",
    "load",
    "add_arguments",
]

SCHEMA_VERSION = "v1"
DEVICE_LIST_STRATEGIES = ("envvar", "cdi-cri")
# NVIDIA's MIG strategies, mapped onto gpuslice's resources (node/migstrategy.py).
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


# --- checks: what is wrong with a value, or None ------------------------------------------------


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


def _shutdown_delay(value: Any) -> str | None:
    # Spent in the server's stop, which the runtime bounds (gpuslice/runtime.py, GRACE_SECONDS) with
    # the connections' own drain (up to 10 s) after it.
    return None if 0 <= value <= MAX_SHUTDOWN_DELAY_SECONDS else f"must be 0 to {MAX_SHUTDOWN_DELAY_SECONDS:g}"


MAX_SHUTDOWN_DELAY_SECONDS = 10.0


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


# --- who reads what ---------------------------------------------------------------------------

COMPONENTS = ("webhook", "device-plugin", "dra-plugin", "controller")
WEBHOOK, DEVICE_PLUGIN, DRA_PLUGIN, CONTROLLER = COMPONENTS
NODE_PLUGINS = (DEVICE_PLUGIN, DRA_PLUGIN)
# Why some keys that only the node plugins read may still not differ between nodes (docs/configuration.md,
# "Per-node configuration"). Keys other components read too, or the device plugin does not read,
# may not by who reads them (`_not_per_node`).
_CHART_GRANTS = (
    "the chart grants what it needs (MPS daemon, host /proc, hostPID, eviction rights) to every plugin pod alike"
)

_T = TypeVar("_T")
_KEY = "gpuslice.config"  # the metadata entry of a dataclass field that is a schema key


class _KeySpec:
    """What a key's declaration says besides its type and default (a plain class: made at import
    in a fraction of a dataclass's time)."""

    __slots__ = ("help", "check", "read_by", "not_per_node")

    def __init__(
        self,
        help: str,
        check: Callable[[Any], str | None],
        read_by: tuple[str, ...] | None,  # None: the section's READ_BY
        not_per_node: str | None,  # None: the section's NOT_PER_NODE, else what read_by implies
    ) -> None:
        self.help, self.check, self.read_by, self.not_per_node = help, check, read_by, not_per_node


def key(
    default: _T,
    help: str,
    *,
    check: Callable[[_T], str | None] = _always_ok,
    read_by: Sequence[str] | None = None,
    not_per_node: str | None = None,
) -> _T:
    """A schema key: a dataclass field with its default, what `check` finds wrong in a value (None
    if nothing), its help (flag and docs), and, where they differ from its section's, the components
    that read it and why a node configuration may not set it."""
    spec = _KeySpec(help, check, None if read_by is None else tuple(read_by), not_per_node)
    return dataclasses.field(default=default, metadata={_KEY: spec})


# --- the sections -----------------------------------------------------------------------------
# One frozen dataclass per concern, each a mapping of the YAML file, with `READ_BY` (the components
# whose --help shows its keys) and, optionally, `NOT_PER_NODE` (why its keys may not differ between
# nodes). Comments say what the help does not: the why, and the code that uses a key.


@dataclasses.dataclass(frozen=True)
class MpsConfig:
    """Per-pod MPS limits (docs/isolation.md)."""

    READ_BY: ClassVar = NODE_PLUGINS
    NOT_PER_NODE: ClassVar = _CHART_GRANTS

    enabled: bool = key(False, "give each container a per-pod MPS memory and SM limit")
    pipe_directory: str = key("/run/nvidia/mps/pipe", "host directory of the MPS control pipe", check=_absolute)
    # Where the pipe directory appears inside containers.
    container_pipe_directory: str = key(
        "/run/nvidia/mps/pipe", "where the MPS pipe directory is mounted in containers", check=_absolute
    )
    # Host directory shared as /dev/shm by the MPS daemon and its clients (RAM-backed under /run).
    shm_directory: str = key(
        "/run/nvidia/mps/shm", "host directory the MPS daemon and its clients share as /dev/shm", check=_absolute
    )


@dataclasses.dataclass(frozen=True)
class HealthConfig:
    """XID events and the probes of unhealthy GPUs (node/health.py)."""

    READ_BY: ClassVar = NODE_PLUGINS

    enabled: bool = key(True, "watch NVML XID events")
    ignored_xids: tuple[int, ...] = key(
        DEFAULT_IGNORED_XIDS, "XIDs that do not mark a GPU unhealthy (application errors)", check=_xids
    )
    # How often an unhealthy GPU is probed through NVML to see if it has recovered.
    recovery_interval_seconds: float = key(30.0, "seconds between NVML probes of an unhealthy GPU", check=_positive)
    event_timeout_ms: int = key(5000, "NVML event wait timeout", check=_positive)


@dataclasses.dataclass(frozen=True)
class SteeringConfig:
    """Node labels that let the stock scheduler see per-GPU free memory (issue 6): the node plugins
    write them, the webhook steers pods by them."""

    READ_BY: ClassVar = (WEBHOOK, *NODE_PLUGINS)

    enabled: bool = key(True, "publish and use the steering node labels")
    # What a pod takes is written at once (node/labels.py over_promises); releases and the
    # score wait this long.
    label_min_interval_seconds: float = key(
        2.0,
        "minimum seconds between two label writes of a node that only give back (what pods take is written at once; "
        "in DRA mode it waits too)",
        check=_positive,
        read_by=NODE_PLUGINS,
    )
    # How often the plugin re-reads kubelet's PodResources List to notice released devices.
    pod_resources_poll_seconds: float = key(
        5.0, "seconds between reads of kubelet's PodResources List", check=_positive, read_by=NODE_PLUGINS
    )
    # So that the CPU of pods without a GPU does not strand whole GPUs (docs/steering.md, "Pods without a GPU").
    cpu_pods: bool = key(
        True, "prefer nodes without a fully free GPU for pods that ask for no device", read_by=[WEBHOOK]
    )
    # Nodes with little GPU memory left are those whose CPU the pods still to come can use least
    # (docs/steering.md, "Nodes with little GPU memory left first").
    cpu_pods_nearly_full_mib: int = key(
        8192,
        "with `cpuPods`: prefer, among nodes without a fully free GPU, those with less free GPU memory than this, "
        "the least first (MiB; 0: off)",
        check=_nearly_full,
        read_by=[WEBHOOK],
    )
    # Measured over the pods the webhook admits (webhook/cpudemand.py): where pods without a device
    # ask less, the band costs more than it gains.
    cpu_pods_nearly_full_cpu_percent: int = key(
        25,
        "with `cpuPodsNearlyFullMiB`: only while pods asking for no device ask more than this percentage of"
        " the CPU admitted (0: always)",
        check=_percent,
        read_by=[WEBHOOK],
    )
    # The plugin publishes each node's CPU beyond this per free GPU (or short of it); the webhook
    # prefers for a GPU pod the nodes whose CPU left after it still matches their free GPUs
    # (docs/steering.md, "CPU beside the GPUs").
    cpu_per_gpu_milli: int = key(
        12000,
        "CPU millicores expected per GPU: GPU pods prefer nodes whose CPU left matches their free GPUs (0: off)",
        check=_cpu_per_gpu,
    )


@dataclasses.dataclass(frozen=True)
class MonitorConfig:
    """What pods really use on the node's GPUs, and what happens when one uses more than its
    grant (issue 15; docs/isolation.md)."""

    READ_BY: ClassVar = NODE_PLUGINS

    enabled: bool = key(True, "sample per-pod GPU memory use from NVML", not_per_node=_CHART_GRANTS)
    interval_seconds: float = key(10.0, "seconds between two samples of the GPUs and their processes", check=_positive)
    overuse_policy: str = key(
        "warn",
        "what follows the Event when a container uses more GPU memory than granted: warn, evict or kill",
        check=_one_of(*OVERUSE_POLICIES),
        not_per_node=_CHART_GRANTS,
    )
    overuse_tolerance_mib: int = key(
        256, "MiB a container may use above its grant before it counts as over-use", check=_not_negative
    )
    # Above its grant plus the tolerance.
    overuse_seconds: float = key(
        30.0, "seconds a container must stay above its grant before it is an over-use", check=_positive
    )


@dataclasses.dataclass(frozen=True)
class DraConfig:
    """DRA mode (docs/dra.md): the kubelet DRA plugin and the webhook's ResourceClaims."""

    READ_BY: ClassVar = (DRA_PLUGIN,)
    NOT_PER_NODE: ClassVar = "the DRA plugin does not read node configurations"

    # Instead of extended resources.
    enabled: bool = key(
        False, "webhook: turn the annotations into ResourceClaims of the DRA driver (DRA mode)", read_by=[WEBHOOK]
    )
    # Changes in between coalesce.
    slice_min_interval_seconds: float = key(
        2.0, "DRA plugin: minimum seconds between two ResourceSlice writes", check=_positive
    )
    # Compares the published slices with the wanted ones, repairing slices someone else changed or deleted.
    slice_resync_seconds: float = key(
        300.0, "DRA plugin: seconds between full checks of the published ResourceSlices", check=_positive
    )


@dataclasses.dataclass(frozen=True)
class RequeueConfig:
    """Controller: recreate converted bare pods that kubelet refused (controller/requeue.py)."""

    READ_BY: ClassVar = (CONTROLLER,)

    enabled: bool = key(True, "controller: recreate converted pods without a controller that kubelet refused")
    max_attempts: int = key(5, "controller: recreations of one refused pod before it is left Failed", check=_positive)
    backoff_seconds: float = key(
        1.0, "controller: wait before the first recreation of a refused pod (doubled each time)", check=_positive
    )


@dataclasses.dataclass(frozen=True)
class PacingConfig:
    """Scheduling gates on converted pods, released by the controller's pacer (pacer/; docs/steering.md, "Pacing")."""

    READ_BY: ClassVar = (CONTROLLER,)

    # Webhook: gates while a controller leads (controller.lease*). Device plugin: the pacer waits
    # for the labels.
    enabled: bool = key(
        False,
        "webhook: gate converted pods for the controller to release, while it leads; device plugin: "
        "write every allocation to the labels at once",
        read_by=COMPONENTS,
    )
    # Each released pod goes only where it cannot race the others (pacer/room.py).
    max_in_flight: int = key(
        32, "controller: released pods not yet bound or found unschedulable, at most", check=_positive
    )
    bind_timeout_seconds: float = key(
        10.0, "controller: seconds a released pod counts as in flight at most", check=_positive
    )
    # A node whose kubelet does not admit what is bound to it (e.g. NotReady) would otherwise hold
    # back every pod that could go there.
    lag_timeout_seconds: float = key(
        10.0,
        "controller: seconds a node's labels may lag its bound pods before the pacer stops waiting for them",
        check=_positive,
    )


@dataclasses.dataclass(frozen=True)
class ControllerConfig:
    """The controller's leader election (controller/; docs/architecture.md, "The controller"); the
    webhook reads it to gate pods only while a leader renews it (a controller that is down must not
    leave every new pod waiting)."""

    READ_BY: ClassVar = (CONTROLLER, WEBHOOK)

    # The leader alone requeues and paces, and renews the Lease.
    lease_name: str = key(
        "gpuslice-controller",
        "controller: the coordination.k8s.io Lease its replicas elect a leader with (the leader requeues "
        "and paces); webhook: with pacing on, gates pods only while that Lease is renewed (the chart's default: "
        "`<fullname>-controller`)",
        check=_dns_subdomain,
    )
    lease_namespace: str = key(
        "",
        "controller and webhook: the Lease's namespace (empty: their own, from POD_NAMESPACE, else default)",
        check=_namespace_or_empty,
    )
    lease_seconds: int = key(
        15,
        "controller: seconds a renewal holds (renewed every third of it; a standby takes over after it); "
        "webhook: pods are no longer gated once the last renewal is older",
        check=_positive,
    )

    def lease_namespace_in(self, environ: Mapping[str, str]) -> str:
        """The Lease's namespace: `lease_namespace`, else the pod's own (POD_NAMESPACE), else "default"."""
        return self.lease_namespace or environ.get("POD_NAMESPACE") or "default"


@dataclasses.dataclass(frozen=True)
class WebhookConfig:
    """Bounds on the webhook's HTTPS connections (issue 13.1; docs/webhook.md, "Connections")."""

    READ_BY: ClassVar = (WEBHOOK,)

    # Longer than the 90 s kube-apiserver's client keeps an idle connection, so the client closes first.
    idle_timeout_seconds: float = key(
        120.0,
        "webhook: seconds a connection may wait for its next request (headers included) before it is closed",
        check=_positive,
    )
    # Clients that connect and send nothing hold no place for long.
    first_request_timeout_seconds: float = key(
        10.0,
        "webhook: seconds after it is accepted a connection may take to send its first request's headers "
        "(TLS handshake included) before it is closed",
        check=_positive,
    )
    # Counted once its headers have arrived.
    body_timeout_seconds: float = key(10.0, "webhook: seconds a request body may take to arrive", check=_positive)
    tls_handshake_timeout_seconds: float = key(10.0, "webhook: seconds a TLS handshake may take", check=_positive)
    max_connection_age_seconds: float = key(
        600.0,
        "webhook: seconds after which a connection is closed once its current request is answered",
        check=_positive,
    )
    max_connections: int = key(
        1000,
        "webhook: connections served at once (one more closes the one idle the longest; 503 when none is idle)",
        check=_positive,
    )
    # Upstream's endpoints lag a deleted pod by a moment: a replica that stopped listening at once
    # would have the API server's admissions in that moment refused (failurePolicy: Fail).
    shutdown_delay_seconds: float = key(
        5.0,
        "webhook: seconds it keeps serving after SIGTERM, answering /readyz with 503, before it stops "
        "accepting connections: the API server stops sending admissions to a deleted replica only once its "
        "endpoint is gone (within the pod's termination grace)",
        check=_shutdown_delay,
    )


@dataclasses.dataclass(frozen=True)
class Config:
    """The whole configuration, every component's: the top-level keys (read by every component
    unless a key says otherwise) and one field per section, in the order of the documentation."""

    READ_BY: ClassVar = COMPONENTS

    resource_prefix: str = key(
        contract.DEFAULT_PREFIX,
        "prefix of every resource, label and annotation: a DNS subdomain of your own (not in `kubernetes.io` or "
        "`k8s.io`, not starting with `requests.`)",
        check=_prefix,
    )
    memory_unit_mib: int = key(
        contract.DEFAULT_UNIT_MIB,
        "MiB of GPU memory per advertised device (part of each device's ID; changing it needs a drain: "
        "[deviceplugin.md](deviceplugin.md#changing-the-unit-size))",
        check=_positive,
    )
    # The node plugins' top-level keys.
    device_list_strategy: str = key(
        "envvar",
        "how a container is given its GPU: envvar (NVIDIA_VISIBLE_DEVICES) or cdi-cri (CDI devices)",
        check=_one_of(*DEVICE_LIST_STRATEGIES),
        read_by=NODE_PLUGINS,
    )
    cdi_kind: str = key(
        "nvidia.com/gpu", "CDI kind of the GPU devices for cdi-cri", check=_cdi_kind, read_by=NODE_PLUGINS
    )
    # Mixed is what the plugin always did: MIG devices as <prefix>/mig-<profile>, other GPUs as units.
    mig_strategy: str = key(
        "mixed",
        "device plugin and DRA plugin: how GPUs in MIG mode are advertised, with NVIDIA's names: `mixed` (one "
        "`mig-<profile>` resource per profile, other GPUs as `gpu-memory` units), `single` (every GPU in MIG mode "
        "with MIG devices of one profile; each MIG device shared as `gpu-memory` units; any other layout is "
        "refused at start-up), `none` (GPUs in MIG mode left out). [deviceplugin.md](deviceplugin.md#mig-strategies)",
        check=_one_of(*MIG_STRATEGIES),
        read_by=NODE_PLUGINS,
    )
    mps: MpsConfig = MpsConfig()
    health: HealthConfig = HealthConfig()
    steering: SteeringConfig = SteeringConfig()
    monitor: MonitorConfig = MonitorConfig()
    # The webhook's top-level keys.
    default_gpu_memory_mib: int = key(
        81920,
        "GPU memory assumed for gpu-fraction when the webhook has no cluster view",
        check=_positive,
        read_by=[WEBHOOK],
    )
    # On by default: on nodes gpuslice serves nothing else advertises nvidia.com/gpu, so a plain
    # `nvidia.com/gpu: N` pod would otherwise stay Pending. Off where NVIDIA's plugin serves other nodes.
    convert_whole_gpus: bool = key(
        True, "turn plain nvidia.com/gpu requests into whole GPUs of memory units", read_by=[WEBHOOK]
    )
    ignored_namespaces: tuple[str, ...] = key(
        ("kube-system",), "namespaces whose pods the webhook leaves alone", check=_namespaces, read_by=[WEBHOOK]
    )
    # "" leaves it; "gpuslice-binpack" with the chart's profile.
    scheduler_name: str = key("", "schedulerName set on converted pods", check=_scheduler_name, read_by=[WEBHOOK])
    converted_pod_tolerations: tuple[dict[str, Any], ...] = key(
        DEFAULT_CONVERTED_POD_TOLERATIONS,
        "webhook: tolerations added to every converted pod not already tolerating them (a JSON list in a flag "
        "or environment variable)",
        check=_tolerations,
        read_by=[WEBHOOK],
    )
    dra: DraConfig = DraConfig()
    requeue: RequeueConfig = RequeueConfig()
    pacing: PacingConfig = PacingConfig()
    controller: ControllerConfig = ControllerConfig()
    webhook: WebhookConfig = WebhookConfig()
    # Not keys: the names of the file's nodeConfigs, and the one layered into this Config ("" for none).
    node_config_names: tuple[str, ...] = ()
    node_config: str = ""

    @functools.cached_property
    def contract(self) -> contract.Contract:
        # Built once per Config (the fields are frozen): the webhook reads it several times per admission.
        return contract.Contract(prefix=self.resource_prefix, unit_mib=self.memory_unit_mib)


# --- the schema, read from the declarations ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Field:
    """One key of the schema, as its declaration in a section gives it."""

    path: str  # YAML path, dotted: "mps.pipeDirectory"
    attr: str  # Config attribute path, dotted: "mps.pipe_directory"
    kind: type  # bool, int, float, str or tuple (a list)
    check: Callable[[Any], str | None]  # returns what is wrong, or None
    help: str
    item: type = str  # element type for tuples: int, str or dict
    read_by: tuple[str, ...] = COMPONENTS  # the components whose --help shows its flag
    not_per_node: str | None = None  # why a node configuration may not set it; None: it may

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


# The annotations a key may have, as written (strings, under `from __future__ import annotations`):
# its kind and, for a list, the kind of its items.
_KINDS: dict[str, tuple[type, type]] = {
    "bool": (bool, str),
    "int": (int, str),
    "float": (float, str),
    "str": (str, str),
    "tuple[int, ...]": (tuple, int),
    "tuple[str, ...]": (tuple, str),
    "tuple[dict[str, Any], ...]": (tuple, dict),
}


def _yaml_name(attr: str) -> str:
    """memory_unit_mib -> memoryUnitMiB"""
    head, *words = attr.split("_")
    return head + "".join("MiB" if word == "mib" else word.capitalize() for word in words)


def _not_per_node(read_by: tuple[str, ...], declared: str | None) -> str | None:
    """Why a node configuration may not set a key that `read_by` read; None when it may: the device
    plugin reads it, nothing else but the DRA plugin does (which reads no node configuration), and
    its declaration (`declared`) gives no reason against."""
    if declared is not None:
        return declared
    if DEVICE_PLUGIN not in read_by:
        return f"only the {' and the '.join(read_by)} read{'s' if len(read_by) == 1 else ''} it"
    others = [component for component in read_by if component not in NODE_PLUGINS]
    if others:
        return f"the {others[0]} reads it too, with one value for the whole cluster"
    return None


def _field(section: type, declared: dataclasses.Field[Any], path: str, attr: str) -> Field:
    spec = declared.metadata.get(_KEY)
    kind = _KINDS.get(declared.type) if isinstance(declared.type, str) else None
    if not isinstance(spec, _KeySpec) or kind is None:
        raise TypeError(f"{section.__name__}.{declared.name}: a section's fields are key()s of {', '.join(_KINDS)}")
    read_by = section.READ_BY if spec.read_by is None else spec.read_by  # type: ignore[attr-defined]
    reason = spec.not_per_node or getattr(section, "NOT_PER_NODE", None)
    return Field(
        path + _yaml_name(declared.name),
        attr + declared.name,
        kind[0],
        spec.check,
        spec.help,
        kind[1],
        read_by,
        _not_per_node(read_by, reason),
    )


def _declared() -> list[Field]:
    """Config's top-level keys and its sections' keys, in the order they are declared."""
    fields: list[Field] = []
    for declared in dataclasses.fields(Config):
        default, name = declared.default, declared.name
        if _KEY in declared.metadata:
            fields.append(_field(Config, declared, "", ""))
        elif dataclasses.is_dataclass(default) and not isinstance(default, type):  # a section
            section = type(default)
            fields += (_field(section, sub, _yaml_name(name) + ".", name + ".") for sub in dataclasses.fields(section))
    return fields


FIELDS: tuple[Field, ...] = tuple(_declared())
_BY_PATH = {f.path: f for f in FIELDS}
_SECTIONS = {f.path.split(".")[0] for f in FIELDS if "." in f.path}

NODE_CONFIGS_KEY = "nodeConfigs"
# Keys a named node configuration may set: read only by the device plugin on its node (and the DRA
# plugin, which reads no node configuration), and needing nothing the chart grants to every plugin
# pod alike. Why each other key may not differ between nodes is its Field's `not_per_node`
# (docs/configuration.md, "Per-node configuration").
PER_NODE_KEYS = tuple(f.path for f in FIELDS if f.not_per_node is None)
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
        sub = dataclasses.replace(field, kind=field.item, check=_always_ok)
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
            field = _BY_PATH[path]
            if field.not_per_node is not None:
                raise ConfigError(
                    f"{where}.{path}: cannot differ between nodes: {field.not_per_node}; a node configuration may set "
                    + ", ".join(PER_NODE_KEYS)
                )
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


# A component's --help shows the flags of the keys it reads (each section's READ_BY, or its key's);
# its file and environment still accept the whole schema (one file can configure every component).


def reads(component: str | None, field: Field) -> bool:
    """Whether `component` reads `field` (None: every component, e.g. the simulator and the demo,
    which run both halves)."""
    if component is None:
        return True
    if component not in COMPONENTS:
        raise ValueError(f"unknown component {component!r}; known: {', '.join(COMPONENTS)}")
    return component in field.read_by


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
    """A Markdown table of the schema: the one in docs/configuration.md, which
    tests/core/test_config_docs.py keeps equal to it (`python -m gpuslice.config` prints it)."""
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


if __name__ == "__main__":
    print(describe())
