"""Where kube-scheduler's time goes during a replay: its CPU profiles (`gpuslice-sim --scheduler kube
--profile-scheduler DIR`) and, from its metrics, how often it tried pods and what sent them back.

A thread asks the scheduler's /debug/pprof for one profile after another, each `seconds` long, and
writes them as DIR/scheduler-NNN.pb.gz until stopped; `go tool pprof -top DIR/*.pb.gz` merges them.
Where the time of a DRA burst goes (issue 35) is read from these: the allocator, CEL, the
scheduler's own queue and the API round trips each have their own frames.

May import the other gpuslice.sim modules.
"""

from __future__ import annotations

import collections
import logging
import pathlib
import threading

from prometheus_client import parser

from gpuslice.sim import controlplane

log = logging.getLogger(__name__)

PROFILE_SECONDS = 20
RETRY_SECONDS = 1.0  # after a failed profile: the scheduler may be starting again


class SchedulerProfiler:
    """Profiles the scheduler `name` of `plane` into `directory` from `start()` to `stop()`."""

    def __init__(
        self,
        plane: controlplane.ControlPlane,
        directory: pathlib.Path,
        *,
        name: str = "kube-scheduler",
        seconds: int = PROFILE_SECONDS,
    ) -> None:
        self.plane = plane
        self.directory = directory
        self.name = name
        self.seconds = seconds
        self.written: list[pathlib.Path] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"profile-{name}", daemon=True)

    def start(self) -> SchedulerProfiler:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """No further profile is asked for; the one under way is kept if it ends within its time."""
        self._stop.set()
        self._thread.join(timeout=self.seconds + 35)

    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                profile = self.plane.cpu_profile(self.name, self.seconds)
            except (OSError, RuntimeError) as exc:
                # The scheduler exited (the replay starts it again, sim/keeper.py), or refused: said once
                # per spell, and asked again a little later.
                if not failing and not self._stop.is_set():
                    log.warning("no CPU profile of %s: %s", self.name, exc)
                failing = True
                self._stop.wait(RETRY_SECONDS)
                continue
            failing = False
            path = self.directory / f"scheduler-{len(self.written):03d}.pb.gz"
            path.write_bytes(profile)
            self.written.append(path)


def scheduling_counts(metrics: str) -> dict[str, dict[str, int]]:
    """From the scheduler's metrics text: its scheduling attempts by result (`attempts`), and the pods
    its queue took in by the event that moved them and the queue it moved them to
    (`pods_queued_by_event`, "ResourceClaim/Add: active"). An unschedulable attempt filters every
    node; the events say which of them sent a pod back for another."""
    attempts: collections.Counter[str] = collections.Counter()
    queued: collections.Counter[str] = collections.Counter()
    for family in parser.text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == "scheduler_schedule_attempts_total":
                attempts[sample.labels.get("result", "?")] += int(sample.value)
            elif sample.name == "scheduler_queue_incoming_pods_total" and sample.value:
                queued[f"{sample.labels.get('event', '?')}: {sample.labels.get('queue', '?')}"] += int(sample.value)
    return {"attempts": dict(attempts.most_common()), "pods_queued_by_event": dict(queued.most_common())}
