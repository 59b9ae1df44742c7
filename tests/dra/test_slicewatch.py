"""The DRA plugin's watch of its node's ResourceSlices wakes the publisher when a slice may be
missing (kubelet wipes them when it restarts), and not for the events of its own writes."""

from __future__ import annotations

from gpuslice.dra import slicewatch


def watch() -> tuple[slicewatch.NodeSlices, list[int]]:
    woken: list[int] = []
    return slicewatch.NodeSlices(lambda: None, "node-1", "gpu.gpuslice.io", lambda: woken.append(1)), woken


def test_the_watch_asks_only_for_this_nodes_slices_of_this_driver() -> None:
    nodes_slices, _ = watch()
    assert nodes_slices.field_selector == "spec.nodeName=node-1,spec.driver=gpu.gpuslice.io"


def test_a_deleted_slice_wakes_the_publisher() -> None:
    nodes_slices, woken = watch()
    nodes_slices.apply("DELETED", {"metadata": {"name": "node-1-gpu.gpuslice.io-0"}})
    assert woken == [1] and nodes_slices.deletions == 1


def test_the_publishers_own_writes_do_not_wake_it() -> None:
    nodes_slices, woken = watch()
    nodes_slices.apply("ADDED", {"metadata": {"name": "a"}})
    nodes_slices.apply("MODIFIED", {"metadata": {"name": "a"}})
    assert woken == []


def test_a_fresh_list_wakes_the_publisher_for_deletions_it_may_have_missed() -> None:
    nodes_slices, woken = watch()
    nodes_slices.replace([])
    assert woken == [1]
