"""A fake /proc tree for the usage monitor's tests: per-PID `stat` and `cgroup` files, `uptime`
and a `self` link, written where the monitor is told /proc is (`--proc-root`).

`cgroup_file` writes the cgroup file of a container process the way kubelet's layouts look on a
node: cgroup v1 (one line per hierarchy) or v2 (one `0::` line), the systemd or cgroupfs driver,
containerd or CRI-O naming, optionally as seen from inside another cgroup namespace.
"""

from __future__ import annotations

import os
import pathlib

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

# (cgroup version, runtime, driver): every combination kubelet produces with these runtimes.
LAYOUTS = [
    (version, runtime, driver)
    for version in ("v1", "v2")
    for runtime in ("containerd", "cri-o")
    for driver in ("systemd", "cgroupfs")
]
_V1_CONTROLLERS = ("hugetlb", "memory", "pids", "devices", "cpu,cpuacct", "blkio", "cpuset")


def container_path(runtime: str, driver: str, pod_uid: str, container_id: str, qos: str = "burstable") -> str:
    """The container's cgroup path from the root of the hierarchy."""
    if driver == "systemd":
        escaped = pod_uid.replace("-", "_")
        if qos == "guaranteed":
            pod = f"/kubepods.slice/kubepods-pod{escaped}.slice"
        else:
            pod = f"/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{escaped}.slice"
        scope = {"containerd": "cri-containerd", "cri-o": "crio"}[runtime]
        return f"{pod}/{scope}-{container_id}.scope"
    pod = f"/kubepods/pod{pod_uid}" if qos == "guaranteed" else f"/kubepods/{qos}/pod{pod_uid}"
    return f"{pod}/{container_id}" if runtime == "containerd" else f"{pod}/crio-{container_id}"


def cgroup_file(version: str, path: str) -> str:
    """The text of /proc/<pid>/cgroup for a process in cgroup `path`."""
    if version == "v2":
        return f"0::{path}\n"
    lines = [f"{12 - i}:{controller}:{path}" for i, controller in enumerate(_V1_CONTROLLERS)]
    lines += [f"1:name=systemd:{path}", "0::/"]
    return "\n".join(lines) + "\n"


def stat_line(pid: int, start_ticks: int, comm: str = "python3") -> str:
    """A /proc/<pid>/stat line: field 22 is the start time in clock ticks since boot."""
    rest = ["S", "1", str(pid), str(pid), "0", "-1", "4194560"] + ["0"] * 12 + [str(start_ticks)] + ["0"] * 30
    return f"{pid} ({comm}) " + " ".join(rest) + "\n"


class FakeProc:
    def __init__(self, root: pathlib.Path, uptime: float = 10_000.0) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.set_uptime(uptime)

    @property
    def path(self) -> str:
        return str(self.root)

    def set_uptime(self, seconds: float) -> None:
        self.uptime = seconds
        (self.root / "uptime").write_text(f"{seconds:.2f} 12345.67\n")

    def add(self, pid: int, cgroup: str, *, started: float | None = None, comm: str = "python3") -> int:
        """Process `pid` in `cgroup` (file text), started `started` seconds after boot (default:
        a minute ago); returns its start time in ticks."""
        ticks = int((self.uptime - 60 if started is None else started) * CLOCK_TICKS)
        directory = self.root / str(pid)
        directory.mkdir(exist_ok=True)
        (directory / "stat").write_text(stat_line(pid, ticks, comm))
        (directory / "cgroup").write_text(cgroup)
        return ticks

    def add_container_process(
        self, pid: int, pod_uid: str, container_id: str, *, layout=("v2", "containerd", "systemd"), **kwargs
    ) -> int:
        version, runtime, driver = layout
        return self.add(pid, cgroup_file(version, container_path(runtime, driver, pod_uid, container_id)), **kwargs)

    def remove(self, pid: int) -> None:
        directory = self.root / str(pid)
        for name in ("stat", "cgroup"):
            (directory / name).unlink(missing_ok=True)
        directory.rmdir()

    def link_self(self, pid: int | None = None) -> None:
        """`self` -> `pid` (default: this test process), as procfs resolves it for the reader."""
        link = self.root / "self"
        if link.is_symlink():
            link.unlink()
        link.symlink_to(str(os.getpid() if pid is None else pid))
