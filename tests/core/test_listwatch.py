"""What each list + watch of the components asks the API server for, and with what timing: the
subclasses of gpuslice.listwatch.ListWatch only name their list call, selector and defaults, and
pass the timing they are given on. (The loop itself is tested in tests/webhook/test_nodewatch.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice import config, listwatch
from gpuslice.controller import requeue
from gpuslice.dra import slicewatch
from gpuslice.node import nodepods
from gpuslice.pacer import controller
from gpuslice.webhook import cluster, nodewatch, waiting


class FakeApi:
    """Hands out named stand-ins for the client's list functions."""

    def __getattr__(self, name: str) -> str:
        return name


API: Any = FakeApi()
SETTINGS = config.Config()


def view() -> cluster.ClusterView:
    return cluster.ClusterView(SETTINGS.contract, default_gpu_memory_mib=81920)


WATCHES = {
    "webhook-nodes": (lambda: nodewatch.NodeWatcher(API, view()), "list_node", None, 30.0),
    "webhook-pending-pods": (
        lambda: waiting.WaitingPods(API, view()),
        "list_pod_for_all_namespaces",
        "status.phase=Pending",
        30.0,
    ),
    "webhook-refused-pods": (
        lambda: waiting.RefusedPods(API, waiting.WaitingPods(API, view())),
        "list_pod_for_all_namespaces",
        "status.phase=Failed",
        30.0,
    ),
    "controller-refused-pods": (
        lambda: requeue.Requeuer(API, SETTINGS).failed,
        "list_pod_for_all_namespaces",
        "status.phase=Failed",
        30.0,
    ),
    "pacer-pods": (
        lambda: controller.Pacer(API, SETTINGS, registry=None).pods,
        "list_pod_for_all_namespaces",
        "status.phase!=Succeeded,status.phase!=Failed",
        30.0,
    ),
    "pacer-nodes": (lambda: controller.Pacer(API, SETTINGS, registry=None).nodes, "list_node", None, 30.0),
    "device-plugin-node-pods": (
        lambda: nodepods.NodePods(lambda: API, "n1"),
        "list_pod_for_all_namespaces",
        "spec.nodeName=n1",
        10.0,
    ),
    "dra-node-slices": (
        lambda: slicewatch.NodeSlices(lambda: API, "n1", "gpu.gpuslice.io", lambda: None),
        "list_resource_slice",
        "spec.nodeName=n1,spec.driver=gpu.gpuslice.io",
        10.0,
    ),
}


@pytest.mark.parametrize(("make", "call", "selector", "request_timeout"), WATCHES.values(), ids=WATCHES)
def test_each_watch_asks_for_its_own_objects_with_its_own_defaults(make, call, selector, request_timeout):
    watch = make()
    assert isinstance(watch, listwatch.ListWatch)
    assert watch._list_call() == call
    assert watch.field_selector == selector
    assert (watch.request_timeout_seconds, watch.watch_timeout_seconds) == (request_timeout, 300)
    assert (watch.backoff_initial_seconds, watch.backoff_max_seconds) == (0.5, 30.0)


def test_timing_given_to_a_subclass_reaches_the_loop():
    timing: listwatch.Options = {
        "watch_timeout_seconds": 7,
        "request_timeout_seconds": 3.0,
        "backoff_initial_seconds": 0.01,
        "backoff_max_seconds": 0.1,
    }
    for watch in (
        nodewatch.NodeWatcher(API, view(), **timing),
        waiting.WaitingPods(API, view(), **timing),
        nodepods.NodePods(lambda: API, "n1", **timing),
        slicewatch.NodeSlices(lambda: API, "n1", "d.example.com", lambda: None, **timing),
    ):
        assert watch.watch_timeout_seconds == 7 and watch.request_timeout_seconds == 3.0
        assert (watch.backoff_initial_seconds, watch.backoff_max_seconds) == (0.01, 0.1)
    assert requeue.Requeuer(API, SETTINGS, watch_timeout_seconds=9).failed.watch_timeout_seconds == 9


def test_a_pod_watch_looks_its_client_up_only_when_it_lists():
    made: list[int] = []

    def core_api() -> Any:
        made.append(1)
        return API

    watch = listwatch.PodWatch(core_api, "pods of nowhere", "spec.nodeName=nowhere")
    assert made == []
    assert watch._list_call() == "list_pod_for_all_namespaces" and made == [1]


def test_a_page_or_event_the_typed_decode_refuses_is_read_whole():
    import json

    watch = listwatch.PodWatch(lambda: API, "pods", "status.phase=Pending", compact=True)
    odd = {"metadata": {"name": "p", "labels": {"a": 1}}}  # a number where a label's string belongs
    pods, token, version = watch._decode_list(
        json.dumps({"metadata": {"resourceVersion": "5"}, "items": [odd]}).encode()
    )
    assert (pods, token, version) == ([odd], None, "5")
    assert watch._decode_event(json.dumps({"type": "ADDED", "object": odd}).encode()) == ("ADDED", odd)


def test_the_cluster_wide_pod_watches_read_their_lists_as_streams_and_the_others_in_pages():
    streamed = {name for name, (make, *_) in WATCHES.items() if make().stream_lists}
    assert streamed == {"webhook-pending-pods", "webhook-refused-pods", "controller-refused-pods", "pacer-pods"}
