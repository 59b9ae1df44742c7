"""Killing a measured process (deviceplugin/killer.py) only while it is still that process: a real
process, its /proc entries faked (pod, container, start time), a PID reused and a process gone."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import subprocess
import sys

from devicepluginkit import victim_fixture  # noqa: F401 - fixture
from fake_proc import CLOCK_TICKS, FakeProc

from gpuslice.deviceplugin import cgroups, killer

UID_A = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa"
UID_B = "bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb"
CID_A, CID_B = "1" * 64, "2" * 64


async def test_a_pid_taken_by_another_process_since_it_was_measured_is_not_killed(tmp_path, victim):
    proc = FakeProc(tmp_path / "proc")
    ticks = proc.add_container_process(victim.pid, UID_A, CID_A)
    measured = cgroups.read(victim.pid, proc.path)
    proc.add_container_process(victim.pid, UID_B, CID_B)  # same PID, now another pod's process
    assert killer.kill_if_same(measured, proc.path) is killer.KillResult.CHANGED
    proc.add(victim.pid, proc.root.joinpath(str(victim.pid), "cgroup").read_text(), started=ticks / CLOCK_TICKS + 5)
    assert killer.kill_if_same(measured, proc.path) is killer.KillResult.CHANGED
    assert victim.returncode is None
    proc.add_container_process(victim.pid, UID_A, CID_A, started=ticks / CLOCK_TICKS)
    assert killer.kill_if_same(dataclasses.replace(measured, start_ticks=ticks), proc.path) is killer.KillResult.KILLED
    assert await asyncio.wait_for(victim.wait(), 10) == -signal.SIGKILL


def test_a_process_that_already_exited_is_reported_gone(tmp_path):
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(finished.stdout)
    identity = cgroups.Identity(pid, 1, cgroups.ContainerRef(UID_A, CID_A))
    assert killer.kill_if_same(identity, str(tmp_path)) in (killer.KillResult.GONE, killer.KillResult.CHANGED)
