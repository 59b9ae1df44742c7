"""Kills one host process, but only if it is still the process that was measured.

Between an NVML sample and the kill, the process may have exited and its PID been given to
another process, maybe in another pod. So the process is first pinned with a pidfd
(pidfd_open: the descriptor keeps meaning that one process even if the PID is reused), then its
start time and cgroup are read again under the /proc root; only if both still match what was
measured is the signal sent, through the pidfd.

PIDs from NVML are host PIDs: signalling them is only meaningful from the host's PID namespace
(the chart runs the plugin with hostPID and CAP_KILL only for the `kill` policy).
`in_host_pid_namespace` checks that the PIDs under the /proc root are the ones this process
would signal. May import gpuslice.deviceplugin.cgroups.
"""

from __future__ import annotations

import enum
import os
import signal

from gpuslice.deviceplugin import cgroups

__all__ = ["KillResult", "in_host_pid_namespace", "kill_if_same"]


class KillResult(enum.Enum):
    KILLED = "killed"
    GONE = "gone"  # the process had already exited
    CHANGED = "changed"  # the PID now belongs to another process (or moved cgroup): left alone
    REFUSED = "refused"  # no permission (no CAP_KILL)


def in_host_pid_namespace(proc_root: str) -> bool:
    """True when `proc_root` shows the PID namespace this process lives in (its `self` link
    names our own PID), so a PID read there is a PID we can signal."""
    try:
        return os.readlink(os.path.join(proc_root, "self")) == str(os.getpid())
    except OSError:
        return False


def kill_if_same(expected: cgroups.Identity, proc_root: str = "/proc", sig: int = signal.SIGKILL) -> KillResult:
    """Send `sig` to `expected.pid` if it is still the process `expected` describes."""
    try:
        pidfd = os.pidfd_open(expected.pid)
    except ProcessLookupError:
        return KillResult.GONE
    except PermissionError:
        return KillResult.REFUSED
    try:
        now = cgroups.read(expected.pid, proc_root)
        if now is None:
            return KillResult.GONE
        if now.start_ticks != expected.start_ticks or now.container != expected.container:
            return KillResult.CHANGED
        try:
            signal.pidfd_send_signal(pidfd, sig)
        except ProcessLookupError:
            return KillResult.GONE
        except PermissionError:
            return KillResult.REFUSED
        return KillResult.KILLED
    finally:
        os.close(pidfd)
