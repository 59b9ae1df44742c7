"""Which pod and container a host process belongs to, from its cgroup (/proc/<pid>/cgroup).

NVML reports GPU processes by host PID. Kubelet puts every container in a cgroup under its pod's
cgroup, and the path names both: the pod by UID, the container by its runtime ID. The layouts
kubelet and the runtimes produce (every segment may be preceded by `..` segments when the reader
sits in its own cgroup namespace):

    cgroup v2  0::<path>                   one line
    cgroup v1  <id>:<controllers>:<path>   one line per hierarchy; any with a pod in it will do

    systemd driver   .../kubepods-burstable.slice/kubepods-burstable-pod<uid, - as _>.slice/<container>.scope
                     (Guaranteed pods: kubepods-pod<uid>.slice)
    cgroupfs driver  .../kubepods/burstable/pod<uid>/<container>
                     (Guaranteed pods: kubepods/pod<uid>)

    <container>      containerd  cri-containerd-<64 hex>.scope (systemd) or <64 hex> (cgroupfs)
                     CRI-O       crio-<64 hex>.scope (systemd)   or crio-<64 hex> (cgroupfs)
                     cri-dockerd docker-<64 hex>.scope (systemd) or <64 hex> (cgroupfs)

Static pods have a 32-hex-digit UID (a hash of their manifest) instead of a UUID. CRI-O's
`crio-conmon-<id>` monitors belong to the pod but to no container. Segments below the container's
(a container running its own cgroup tree) are ignored.

A PID alone does not identify a process: PIDs are reused. `Identity` pairs it with the
process's start time (field 22 of /proc/<pid>/stat, clock ticks since boot), and `read` checks
that the process did not change between the two files it reads. NVML's process list carries no
start time, so a PID it reports may, by the time /proc is read, belong to a process started
since: `read(..., started_by=<seconds since boot when NVML was asked>)` refuses a process that
started later (`uptime_seconds` reads that clock).

Pure parsing plus file reads under a configurable /proc root (tests use a fake tree). Imports no
other gpuslice module.
"""

from __future__ import annotations

import dataclasses
import os
import re

__all__ = ["CLOCK_TICKS", "ContainerRef", "Identity", "parse", "read", "start_ticks", "uptime_seconds"]

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")  # /proc/<pid>/stat's unit of time (100 on Linux)

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
# `pod<uid>` (cgroupfs) or `kubepods[-<qos>]-pod<uid>.slice` (systemd)
_POD_SEGMENT = re.compile(rf"^(?:kubepods(?:-[a-z]+)?-)?pod({_UID})(?:\.slice)?$")
_CONTAINER_SEGMENT = re.compile(r"^(?:(cri-containerd|crio|docker)-)?([0-9a-f]{64})(?:\.scope)?$")
_RUNTIME_BY_PREFIX = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker", None: ""}


@dataclasses.dataclass(frozen=True)
class ContainerRef:
    """A process's place in Kubernetes: its pod's UID and, unless it is a pod-level process (a
    CRI-O conmon, a pause process), its container's runtime ID."""

    pod_uid: str  # as the API server spells it: dashes, lower case
    container_id: str  # 64 hex digits, no runtime prefix; "" for pod-level processes
    runtime: str = ""  # "containerd", "cri-o", "docker" where the path says; "" for cgroupfs IDs


@dataclasses.dataclass(frozen=True)
class Identity:
    """One process instance: its PID, its start time and where it lives (None: not in a pod)."""

    pid: int
    start_ticks: int
    container: ContainerRef | None


def parse(text: str) -> ContainerRef | None:
    """The pod and container named by the contents of a /proc/<pid>/cgroup file, or None for a
    process outside kubelet's pods (a host daemon, a process of another container manager)."""
    best: ContainerRef | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        found = _parse_path(parts[2])
        if found is not None and (best is None or (found.container_id and not best.container_id)):
            best = found  # v1: prefer a hierarchy that names the container too
    return best


def _parse_path(path: str) -> ContainerRef | None:
    raw = [s for s in path.strip().split("/") if s]
    segments = [s for s in raw if s != ".."]
    # Outside our cgroup namespace (a leading ".."), a path may start below the kubepods level
    # (cgroupfs: /../../pod<uid>/<id>); inside it, it must be under kubepods.
    outside_namespace = bool(raw) and raw[0] == ".."
    if not outside_namespace and not any(s == "kubepods" or s.startswith(("kubepods.", "kubepods-")) for s in segments):
        return None
    for i, segment in enumerate(segments):
        pod = _POD_SEGMENT.match(segment)
        if pod is None:
            continue
        uid = pod.group(1).replace("_", "-")
        if i + 1 < len(segments):
            container = _CONTAINER_SEGMENT.match(segments[i + 1])
            if container is not None:
                return ContainerRef(uid, container.group(2), _RUNTIME_BY_PREFIX[container.group(1)])
        return ContainerRef(uid, "")
    return None


def start_ticks(stat: str) -> int:
    """Field 22 (starttime) of a /proc/<pid>/stat line. The command name (field 2) is in
    parentheses and may itself hold spaces and parentheses, so fields are counted after the last ')'."""
    rest = stat[stat.rindex(")") + 2 :].split()
    return int(rest[19])  # fields 3.. start at rest[0]; starttime is field 22


def uptime_seconds(proc_root: str = "/proc") -> float:
    """Seconds since boot (/proc/uptime), the clock process start times are measured on."""
    return float(_read_text(os.path.join(proc_root, "uptime")).split()[0])


def read(pid: int, proc_root: str = "/proc", *, started_by: float | None = None) -> Identity | None:
    """The identity of process `pid` as `proc_root` shows it now, or None when the process is gone
    (or exited and its PID was taken again while we read, or, with `started_by`, the PID now
    names a process that started after that many seconds since boot)."""
    base = os.path.join(proc_root, str(pid))
    try:
        before = start_ticks(_read_text(os.path.join(base, "stat")))
        cgroup = _read_text(os.path.join(base, "cgroup"))
        after = start_ticks(_read_text(os.path.join(base, "stat")))
    except (OSError, ValueError, IndexError):  # gone (ENOENT, ESRCH), or a stat line we cannot read
        return None
    if before != after:
        return None  # the PID was reused between the two reads: the cgroup may be the new process's
    if started_by is not None and before / CLOCK_TICKS > started_by + 1.0 / CLOCK_TICKS:
        return None  # not the process NVML listed: that one has exited and its PID was reused
    return Identity(pid=pid, start_ticks=before, container=parse(cgroup))


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()
