"""What a replay's diagnosis reads from kube-scheduler's metrics (sim/profiling.py), and the profiler
going on across a scheduler's restart. The real scheduler's counters, and the CPU profiles the
replay's profiler writes, are read in tests/e2e/test_real_control_plane.py."""

from __future__ import annotations

import pathlib
import threading

import pytest

from gpuslice.sim import profiling

# Lines as kube-scheduler 1.37 writes them (other families and zero counts are left out).
METRICS = """\
# HELP scheduler_schedule_attempts_total [STABLE] Number of attempts to schedule pods.
# TYPE scheduler_schedule_attempts_total counter
scheduler_schedule_attempts_total{profile="default-scheduler",result="scheduled"} 7
scheduler_schedule_attempts_total{profile="gpuslice-binpack",result="scheduled"} 3
scheduler_schedule_attempts_total{profile="default-scheduler",result="unschedulable"} 2
# HELP scheduler_queue_incoming_pods_total [STABLE] Number of pods added to scheduling queues.
# TYPE scheduler_queue_incoming_pods_total counter
scheduler_queue_incoming_pods_total{event="NodeUpdateNodeLabel",queue="unschedulable"} 40
scheduler_queue_incoming_pods_total{event="NodeUpdateNodeLabel",queue="active"} 1
scheduler_queue_incoming_pods_total{event="UnscheduledPodAdd",queue="active"} 12
scheduler_queue_incoming_pods_total{event="BackoffComplete",queue="active"} 0
# HELP scheduler_pending_pods [STABLE] Number of pending pods.
# TYPE scheduler_pending_pods gauge
scheduler_pending_pods{queue="unschedulable"} 2
"""


def test_attempts_are_summed_over_profiles_and_queue_moves_named_by_event_and_queue() -> None:
    counts = profiling.scheduling_counts(METRICS)
    assert counts["attempts"] == {"scheduled": 10, "unschedulable": 2}
    # Most first; an event that moved no pod is left out.
    assert list(counts["pods_queued_by_event"].items()) == [
        ("NodeUpdateNodeLabel: unschedulable", 40),
        ("UnscheduledPodAdd: active", 12),
        ("NodeUpdateNodeLabel: active", 1),
    ]


def test_a_scheduler_without_those_counters_gives_empty_counts() -> None:
    assert profiling.scheduling_counts("# nothing\n") == {"attempts": {}, "pods_queued_by_event": {}}


class _RestartingPlane:
    """cpu_profile fails while the scheduler is away (its port closed), then answers again."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.asked = 0
        self.enough = threading.Event()

    def cpu_profile(self, name: str, seconds: int) -> bytes:
        self.asked += 1
        if self.asked <= self.failures:
            raise ConnectionRefusedError(111, "Connection refused")
        if self.asked >= self.failures + 2:
            self.enough.set()
        return b"profile"


def test_the_profiler_goes_on_once_a_restarted_scheduler_answers_again(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(profiling, "RETRY_SECONDS", 0.01)
    plane = _RestartingPlane(failures=3)
    profiler = profiling.SchedulerProfiler(plane, tmp_path, seconds=1).start()  # type: ignore[arg-type]
    assert plane.enough.wait(10)
    profiler.stop()
    assert len(profiler.written) >= 2 and all(p.read_bytes() == b"profile" for p in profiler.written)
    # Said once for the spell of failures, not once per try.
    assert [r.getMessage() for r in caplog.records].count(
        "no CPU profile of kube-scheduler: [Errno 111] Connection refused"
    ) == 1
