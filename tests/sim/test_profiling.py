"""What a replay's diagnosis reads from kube-scheduler's metrics (sim/profiling.py). The real
scheduler's counters, and the CPU profiles the replay's profiler writes, are read in
tests/e2e/test_real_control_plane.py."""

from __future__ import annotations

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
