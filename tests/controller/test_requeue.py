"""The requeue rule on its own: which refused pods are recreated, and what the recreation holds.
tests/e2e/test_real_burst.py runs the Requeuer against the real API server and scheduler."""

from __future__ import annotations

import asyncio
import copy
import datetime
from typing import Any

import pytest
from requeuekit import CONTRACT, ENTRY, _Api, _requeuer, refused_pod

from gpuslice import config
from gpuslice.controller import requeue


def test_a_refused_converted_bare_pod_is_requeueable() -> None:
    assert requeue.requeueable(refused_pod(), CONTRACT, max_attempts=5)


@pytest.mark.parametrize(
    "change",
    [
        lambda p: p["status"].update(reason="OutOfcpu"),  # refused for something else: not ours to judge
        lambda p: p["status"].update(phase="Running"),
        lambda p: p["metadata"]["annotations"].pop(CONTRACT.decision_annotation),  # not converted by us
        lambda p: p["metadata"].update(ownerReferences=[{"kind": "ReplicaSet", "name": "rs", "controller": True}]),
        lambda p: p["metadata"].update(deletionTimestamp="2026-11-23T19:01:00Z"),
        lambda p: p["metadata"]["annotations"].update({CONTRACT.requeues_annotation: "5"}),  # attempts used up
    ],
    ids=["other-reason", "running", "not-converted", "has-controller", "being-deleted", "attempts-used"],
)
def test_pods_that_are_not_ours_to_recreate_are_left_alone(change: Any) -> None:
    pod = refused_pod()
    change(pod)
    assert not requeue.requeueable(pod, CONTRACT, max_attempts=5)


def test_a_non_controller_owner_does_not_stop_a_requeue() -> None:
    pod = refused_pod(ownerReferences=[{"kind": "ConfigMap", "name": "owner"}])
    assert requeue.requeueable(pod, CONTRACT, max_attempts=5)


def test_the_replacement_keeps_identity_and_spec_and_drops_the_binding_and_server_fields() -> None:
    pod = refused_pod()
    original = copy.deepcopy(pod)
    fresh = requeue.replacement(pod, CONTRACT)
    assert pod == original  # the refused pod is not modified
    assert fresh["metadata"] == {
        "name": "train",
        "namespace": "team-a",
        "labels": {"app": "train"},
        "annotations": {**original["metadata"]["annotations"], CONTRACT.requeues_annotation: "1"},
    }
    assert "nodeName" not in fresh["spec"] and "status" not in fresh
    assert fresh["spec"]["containers"] == original["spec"]["containers"]
    again = requeue.replacement({**fresh, "status": pod["status"]}, CONTRACT)
    assert again["metadata"]["annotations"][CONTRACT.requeues_annotation] == "2"


def test_a_replacement_is_gated_for_the_pacer_only_while_pacing() -> None:
    pod = refused_pod()
    assert "schedulingGates" not in requeue.replacement(pod, CONTRACT)["spec"]
    gated = requeue.replacement(pod, CONTRACT, paced=True)
    assert gated["spec"]["schedulingGates"] == [{"name": CONTRACT.pacing_gate}]
    again = requeue.replacement({**gated, "status": pod["status"]}, CONTRACT, paced=True)
    assert again["spec"]["schedulingGates"] == [{"name": CONTRACT.pacing_gate}]  # never twice


@pytest.mark.parametrize("alive", [True, False])
def test_the_requeuer_gates_its_replacement_while_a_pacer_is_alive(alive: bool) -> None:
    api = _Api([refused_pod()])
    requeuer = _requeuer(api, paced=lambda: alive)
    asyncio.run(requeuer._requeue(refused_pod()))
    (created,) = api.created
    assert ("schedulingGates" in created["spec"]) is alive


def _count(requeuer: requeue.Requeuer, result: str) -> float:
    return requeuer._requeued.labels(result)._value.get()


def test_the_replacement_is_written_down_before_the_delete_and_forgotten_once_it_exists() -> None:
    api = _Api([refused_pod()])
    requeuer = _requeuer(api)
    asyncio.run(requeuer._requeue(refused_pod()))
    assert api.calls == [
        f"create configmap {ENTRY}",
        "delete pod train",
        "create pod train",
        f"delete configmap {ENTRY}",
    ]
    assert api.config_maps == {} and [p["metadata"]["name"] for p in api.created] == ["train"]
    assert _count(requeuer, "requeued") == 1


def test_a_replica_that_finds_the_entry_written_leaves_the_pod_to_the_one_that_wrote_it() -> None:
    api = _Api([refused_pod()])
    first, second = _requeuer(api), _requeuer(api)
    asyncio.run(first.journal.write(refused_pod()["metadata"]["uid"], requeue.replacement(refused_pod(), CONTRACT)))
    asyncio.run(second._requeue(refused_pod()))
    assert "delete pod train" not in api.calls and ("team-a", "train") in api.pods
    assert _count(second, "gone") == 1


def test_a_pod_deleted_meanwhile_is_not_recreated_and_its_entry_is_dropped() -> None:
    api = _Api()  # the user deleted it before the requeuer's turn
    requeuer = _requeuer(api)
    asyncio.run(requeuer._requeue(refused_pod()))
    assert api.created == [] and api.config_maps == {}
    assert _count(requeuer, "gone") == 1


def test_a_requeue_whose_create_fails_is_finished_from_the_journal_by_a_later_pass() -> None:
    # The pod is deleted, then every create is refused (a quota another pod took, say): before
    # the journal this pod was lost. Its entry stays, and a later pass, of this process or of a
    # replica started after a crash, creates it once the API server takes it.
    api = _Api([refused_pod()])
    api.refuse_creates = 403
    requeuer = _requeuer(api)
    asyncio.run(requeuer._requeue(refused_pod()))
    assert ("team-a", "train") not in api.pods and list(api.config_maps) == [("gpuslice-system", ENTRY)]
    assert _count(requeuer, "error") == 1

    young = asyncio.run(requeuer.journal.recover(requeuer._create))
    assert young.waiting == 1 and young.created == []  # within the grace of a replica mid-requeue
    kept = asyncio.run(requeuer.journal.recover(requeuer._create, grace_seconds=0))
    assert kept.waiting == 1 and kept.created == [] and api.config_maps  # still refused: kept

    api.refuse_creates = None
    restarted = _requeuer(api)
    done = asyncio.run(restarted.finish_journal(grace_seconds=0))
    assert done.created == ["team-a/train"] and api.config_maps == {}
    (created,) = api.created
    assert created["metadata"]["annotations"][CONTRACT.requeues_annotation] == "1"
    assert "nodeName" not in created["spec"]
    # Counted, and said on the new pod where `kubectl describe` shows it.
    assert _count(restarted, "recovered") == 1
    (event,) = api.events
    assert event.reason == "Requeued" and "requeue journal" in event.message
    assert event.involved_object.uid == api.pods[("team-a", "train")].metadata.uid


async def test_a_standby_requeues_nothing_and_takes_over_with_the_failed_pods_it_listed() -> None:
    api = _Api([refused_pod()])
    requeuer = _requeuer(api)  # not leading: a standby replica
    requeuer.failed.replace([refused_pod()])
    requeuer.failed.apply("MODIFIED", refused_pod())
    await asyncio.sleep(0)
    assert api.calls == [] and not requeuer._tasks

    requeuer.set_leading(True)  # the leader went away: this replica took the Lease
    await asyncio.gather(*requeuer._tasks)
    assert [p["metadata"]["name"] for p in api.created] == ["train"]
    assert _count(requeuer, "requeued") == 1


async def test_a_failed_pod_deleted_before_the_takeover_is_not_considered() -> None:
    api = _Api([refused_pod()])
    requeuer = _requeuer(api)
    requeuer.failed.replace([refused_pod()])
    requeuer.failed.apply("DELETED", refused_pod())  # deleted, or no longer Failed
    requeuer.set_leading(True)
    await asyncio.sleep(0)
    assert not requeuer._tasks and api.calls == []


async def test_the_journal_is_swept_when_a_replica_takes_over_not_before() -> None:
    api = _Api([refused_pod()])
    writer = _requeuer(api)
    await writer.journal.write(refused_pod()["metadata"]["uid"], requeue.replacement(refused_pod(), CONTRACT))
    api.config_maps[("gpuslice-system", ENTRY)].metadata.creation_timestamp -= datetime.timedelta(minutes=5)
    standby = _requeuer(api, sweep_seconds=3600)
    sweeping = asyncio.create_task(standby._sweep())
    try:
        await asyncio.sleep(0.05)
        assert ("team-a", "train") in api.pods and api.config_maps  # a standby leaves the entry be
        standby.leading = True
        standby._took_over.set()  # as set_leading(True) does, without the Failed pods
        for _ in range(100):
            if not api.config_maps:
                break
            await asyncio.sleep(0.01)
        assert api.config_maps == {} and api.calls[-2:] == ["create pod train", f"delete configmap {ENTRY}"]
    finally:
        sweeping.cancel()
        await asyncio.gather(sweeping, return_exceptions=True)


def test_the_failed_pod_watch_keeps_only_refused_pods_whole_but_for_their_managed_fields() -> None:
    failed = requeue.Requeuer(_Api(), config.Config()).failed
    completed = refused_pod()
    completed["status"]["reason"] = "Completed"  # a finished Job's pod: never requeued, not kept
    assert failed.keep(completed) is None
    kept = failed.keep(refused_pod())
    assert kept is not None and "managedFields" not in kept["metadata"]
    assert requeue.replacement(kept, CONTRACT) == requeue.replacement(refused_pod(), CONTRACT)


async def test_taking_over_finishes_even_an_entry_written_a_moment_ago() -> None:
    # The leader wrote the entry and deleted the pod, then died before its create: its successor
    # finishes the requeue at once, not once the entry is RECOVERY_GRACE_SECONDS old.
    api = await _entry_without_its_pod()
    await _take_over_and_sweep(api, sweep_seconds=3600)
    assert ("team-a", "train") in api.pods and api.config_maps == {}


async def test_a_leader_sweeping_on_its_own_leaves_a_young_entry_to_its_writer() -> None:
    api = _Api([refused_pod()])
    writer = _requeuer(api)
    await writer.journal.write(refused_pod()["metadata"]["uid"], requeue.replacement(refused_pod(), CONTRACT))
    leader = _requeuer(api, sweep_seconds=3600)
    leader.leading = True  # leading all along: not a takeover
    sweeping = asyncio.create_task(leader._sweep())
    try:
        await asyncio.sleep(0.05)
        assert api.config_maps  # it may belong to a requeue in progress
    finally:
        sweeping.cancel()
        await asyncio.gather(sweeping, return_exceptions=True)


async def test_a_takeover_whose_sweep_failed_sweeps_as_a_takeover_again() -> None:
    # The journal could not be read when this replica took over: its next pass still finishes the
    # young entry at once, not only once it is RECOVERY_GRACE_SECONDS old.
    api = await _entry_without_its_pod()
    listed = api.list_namespaced_config_map
    failures = [RuntimeError("503 from the API server")]

    def list_once_failing(namespace: str, label_selector: str) -> Any:
        if failures:
            raise failures.pop()
        return listed(namespace, label_selector)

    api.list_namespaced_config_map = list_once_failing  # type: ignore[method-assign]
    await _take_over_and_sweep(api, sweep_seconds=0.05)
    assert not failures and ("team-a", "train") in api.pods and api.config_maps == {}


async def _entry_without_its_pod() -> _Api:
    """A leader wrote the requeue's journal entry and deleted the refused pod, then died before
    its create: the API holds the entry and no pod."""
    api = _Api([refused_pod()])
    writer = _requeuer(api)
    await writer.journal.write(refused_pod()["metadata"]["uid"], requeue.replacement(refused_pod(), CONTRACT))
    del api.pods[("team-a", "train")]
    return api


async def _take_over_and_sweep(api: _Api, *, sweep_seconds: float) -> None:
    """A replica takes over (as set_leading(True) does, without the Failed pods) and sweeps the
    journal until it is empty or a second has passed."""
    successor = _requeuer(api, sweep_seconds=sweep_seconds)
    successor.leading = True
    successor._took_over.set()
    sweeping = asyncio.create_task(successor._sweep())
    try:
        for _ in range(100):
            if not api.config_maps:
                break
            await asyncio.sleep(0.01)
    finally:
        sweeping.cancel()
        await asyncio.gather(sweeping, return_exceptions=True)
