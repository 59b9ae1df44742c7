"""The requeue rule on its own: which refused pods are recreated, and what the recreation holds.
tests/e2e/test_real_burst.py runs the Requeuer against the real API server and scheduler."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime
from typing import Any

import kubernetes
import prometheus_client
import pytest

from gpuslice import config
from gpuslice.controller import requeue

CONTRACT = config.Config().contract


def refused_pod(**metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "train",
            "namespace": "team-a",
            "uid": "6f1c2b7e-0000-4000-8000-000000000001",
            "resourceVersion": "4711",
            "creationTimestamp": "2026-11-23T19:00:00Z",
            "labels": {"app": "train"},
            "annotations": {"gpu-fraction": "0.6", CONTRACT.decision_annotation: "{}"},
            "managedFields": [{"manager": "kubectl"}],
            **metadata,
        },
        "spec": {
            "nodeName": "gpu-7",
            "schedulerName": "default-scheduler",
            "containers": [
                {"name": "main", "image": "train:1", "resources": {"limits": {"gpuslice.io/gpu-memory": "191"}}}
            ],
        },
        "status": {
            "phase": "Failed",
            "reason": "UnexpectedAdmissionError",
            "message": "no single GPU had 191 units",
        },
    }


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


class _Api:
    """kube-apiserver's side of what the requeuer calls, in memory: pods and ConfigMaps by name
    (a create of a taken name is 409, a delete of a missing one 404, a delete whose UID
    precondition fails 409), every call recorded in order. Against the real API server:
    tests/e2e/test_real_burst.py."""

    def __init__(self, pods: list[dict[str, Any]] = ()) -> None:  # type: ignore[assignment]
        self.pods: dict[tuple[str, str], Any] = {}
        for pod in pods:
            self._put_pod(pod["metadata"]["namespace"], pod)
        self.config_maps: dict[tuple[str, str], Any] = {}
        self.calls: list[str] = []
        self.created: list[dict[str, Any]] = []
        self.refuse_creates: int | None = None  # an HTTP status every pod create answers
        self.events: list[Any] = []

    def _put_pod(self, namespace: str, body: dict[str, Any]) -> Any:
        metadata = body["metadata"]
        uid = metadata.get("uid") or f"uid-{len(self.calls)}"
        self.pods[(namespace, metadata["name"])] = kubernetes.client.V1Pod(
            metadata=kubernetes.client.V1ObjectMeta(
                name=metadata["name"],
                namespace=namespace,
                uid=uid,
                deletion_timestamp=metadata.get("deletionTimestamp"),
            )
        )
        return self.pods[(namespace, metadata["name"])]

    def delete_namespaced_pod(self, name: str, namespace: str, body: Any) -> None:
        self.calls.append(f"delete pod {name}")
        pod = self.pods.get((namespace, name))
        if pod is None:
            raise kubernetes.client.ApiException(status=404)
        if body.preconditions.uid != pod.metadata.uid:
            raise kubernetes.client.ApiException(status=409)
        del self.pods[(namespace, name)]

    def create_namespaced_pod(self, namespace: str, body: dict[str, Any]) -> Any:
        self.calls.append(f"create pod {body['metadata']['name']}")
        if self.refuse_creates is not None:
            raise kubernetes.client.ApiException(status=self.refuse_creates)
        if (namespace, body["metadata"]["name"]) in self.pods:
            raise kubernetes.client.ApiException(status=409)
        self.created.append(body)
        return self._put_pod(namespace, copy.deepcopy(body))

    def read_namespaced_pod(self, name: str, namespace: str) -> Any:
        pod = self.pods.get((namespace, name))
        if pod is None:
            raise kubernetes.client.ApiException(status=404)
        return pod

    def create_namespaced_event(self, namespace: str, body: Any) -> None:
        self.events.append(body)

    def create_namespaced_config_map(self, namespace: str, body: Any) -> None:
        self.calls.append(f"create configmap {body.metadata.name}")
        key = (namespace, body.metadata.name)
        if key in self.config_maps:
            raise kubernetes.client.ApiException(status=409)
        body.metadata.creation_timestamp = datetime.datetime.now(datetime.UTC)
        self.config_maps[key] = body

    def delete_namespaced_config_map(self, name: str, namespace: str) -> None:
        self.calls.append(f"delete configmap {name}")
        if self.config_maps.pop((namespace, name), None) is None:
            raise kubernetes.client.ApiException(status=404)

    def list_namespaced_config_map(self, namespace: str, label_selector: str) -> Any:
        items = [
            c for (ns, _), c in self.config_maps.items() if ns == namespace and label_selector in c.metadata.labels
        ]
        return kubernetes.client.V1ConfigMapList(items=items)


def _requeuer(api: _Api, **options: Any) -> requeue.Requeuer:
    settings = config.Config()
    settings = dataclasses.replace(settings, requeue=dataclasses.replace(settings.requeue, backoff_seconds=0.0))
    return requeue.Requeuer(
        api,  # type: ignore[arg-type]
        settings,
        registry=prometheus_client.CollectorRegistry(),
        namespace="gpuslice-system",
        **options,
    )


@pytest.mark.parametrize("alive", [True, False])
def test_the_requeuer_gates_its_replacement_while_a_pacer_is_alive(alive: bool) -> None:
    api = _Api([refused_pod()])
    requeuer = _requeuer(api, paced=lambda: alive)
    asyncio.run(requeuer._requeue(refused_pod()))
    (created,) = api.created
    assert ("schedulingGates" in created["spec"]) is alive


ENTRY = f"gpuslice-requeue-{refused_pod()['metadata']['uid']}"


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


@pytest.mark.parametrize(
    ("present", "outcome"),
    [
        ({"uid": "someone-elses"}, "forgotten"),  # the replacement exists, or the user made one
        ({"deletionTimestamp": "2026-11-23T19:01:00Z"}, "waiting"),  # still terminating
    ],
    ids=["other-pod", "terminating"],
)
def test_an_entry_whose_pod_name_is_taken_is_never_created_again(present: dict[str, Any], outcome: str) -> None:
    api = _Api([refused_pod(**present)])
    requeuer = _requeuer(api)
    asyncio.run(requeuer.journal.write(refused_pod()["metadata"]["uid"], requeue.replacement(refused_pod(), CONTRACT)))
    done = asyncio.run(requeuer.journal.recover(requeuer._create, grace_seconds=0))
    assert api.created == []
    assert (done.forgotten, done.waiting) == ((1, 0) if outcome == "forgotten" else (0, 1))
    assert bool(api.config_maps) is (outcome == "waiting")


def test_an_entry_of_a_requeue_in_progress_here_is_left_to_it() -> None:
    api = _Api()
    requeuer = _requeuer(api)
    uid = refused_pod()["metadata"]["uid"]
    asyncio.run(requeuer.journal.write(uid, requeue.replacement(refused_pod(), CONTRACT)))
    done = asyncio.run(requeuer.journal.recover(requeuer._create, busy={uid}, grace_seconds=0))
    assert done.waiting == 1 and api.created == []


def test_an_unreadable_entry_is_left_alone_and_the_others_are_finished() -> None:
    api = _Api()
    requeuer = _requeuer(api)
    asyncio.run(requeuer.journal.write(refused_pod()["metadata"]["uid"], requeue.replacement(refused_pod(), CONTRACT)))
    asyncio.run(requeuer.journal.write("other", {"metadata": {"name": "x", "namespace": "y"}}))
    api.config_maps[("gpuslice-system", "gpuslice-requeue-other")].data["pod.json"] = "{not json"
    done = asyncio.run(requeuer.journal.recover(requeuer._create, grace_seconds=0))
    assert done.created == ["team-a/train"] and list(api.config_maps) == [("gpuslice-system", "gpuslice-requeue-other")]


def test_an_entry_whose_requeuer_died_before_the_delete_is_finished_delete_and_create() -> None:
    # The entry was written, then the process died: the refused pod is still there, Failed. Its
    # entry now also keeps a restarted requeuer from starting over (the write is the lock), so
    # the pass finishes it: the refused pod deleted by its UID, the replacement created.
    api = _Api([refused_pod()])
    requeuer = _requeuer(api)
    asyncio.run(requeuer.journal.write(refused_pod()["metadata"]["uid"], requeue.replacement(refused_pod(), CONTRACT)))
    asyncio.run(requeuer._requeue(refused_pod()))  # a restarted requeuer finds the entry: leaves it
    assert "delete pod train" not in api.calls
    done = asyncio.run(requeuer.journal.recover(requeuer._create, grace_seconds=0))
    assert done.created == ["team-a/train"] and api.config_maps == {}
    assert api.calls[-3:] == ["delete pod train", "create pod train", f"delete configmap {ENTRY}"]
    assert api.pods[("team-a", "train")].metadata.uid != refused_pod()["metadata"]["uid"]


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
    api = _Api([refused_pod()])
    writer = _requeuer(api)
    await writer.journal.write(refused_pod()["metadata"]["uid"], requeue.replacement(refused_pod(), CONTRACT))
    del api.pods[("team-a", "train")]
    successor = _requeuer(api, sweep_seconds=3600)
    successor.leading = True
    successor._took_over.set()
    sweeping = asyncio.create_task(successor._sweep())
    try:
        for _ in range(100):
            if not api.config_maps:
                break
            await asyncio.sleep(0.01)
        assert ("team-a", "train") in api.pods and api.config_maps == {}
    finally:
        sweeping.cancel()
        await asyncio.gather(sweeping, return_exceptions=True)


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
