"""The requeuer's journal (controller/requeue_journal.py) finishing what its entries record: an
entry whose pod name is taken, one of a requeue still in progress, an unreadable one, and one whose
requeuer died before the delete. Written and forgotten around a requeue: tests/controller/test_requeue.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from requeuekit import CONTRACT, ENTRY, _Api, _requeuer, refused_pod

from gpuslice.controller import requeue


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
