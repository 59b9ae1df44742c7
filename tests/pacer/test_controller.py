"""The pacer's bookkeeping between its watches and its release loop (pacer/controller.py), fed
events directly; the loop against the real API server is in tests/e2e/test_real_pacer.py."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import prometheus_client

from gpuslice import config
from gpuslice.pacer import controller

SETTINGS = dataclasses.replace(config.Config(), pacing=config.PacingConfig(enabled=True))
CONTRACT = SETTINGS.contract
UNITS = CONTRACT.gpu_memory_resource
CLASS = CONTRACT.label_gpu_memory_mib


def node(name: str, memory: str = "81559", free: int = 636, free_gpus: int = 2) -> dict[str, Any]:
    """A node of 2 GPUs of 318 units."""
    labels = {
        CLASS: memory,
        CONTRACT.label_free_units: str(free),
        CONTRACT.label_gpu_count: "2",
        CONTRACT.label_free_gpus: str(free_gpus),
    }
    return {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": {UNITS: "636"}}}


def pod(
    name: str, *, units: int = 191, memory: str = "81559", gated: bool = True, node_name: str = "", rv: str = "1"
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "resources": {"limits": {UNITS: str(units)}} if units else {}}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": CLASS, "operator": "In", "values": [memory]}]}]
                }
            }
        },
    }
    if gated:
        spec["schedulingGates"] = [{"name": CONTRACT.pacing_gate}]
    if node_name:
        spec["nodeName"] = node_name
    metadata = {"name": name, "namespace": "team", "uid": name, "resourceVersion": rv, "creationTimestamp": "t0"}
    return {"metadata": metadata, "spec": spec, "status": {"phase": "Pending"}}


def pacer() -> controller.Pacer:
    made = controller.Pacer(None, SETTINGS, registry=prometheus_client.CollectorRegistry())  # type: ignore[arg-type]
    made.nodes.replace([node("h100-a"), node("h200-a", memory="143771")])
    made.replace_pods([])
    return made


def test_gated_pods_wait_in_order_and_leave_the_line_when_let_go_or_deleted() -> None:
    paced = pacer()
    paced.on_pod("ADDED", pod("b"))  # created in the same second as a, seen first
    paced.on_pod("ADDED", pod("a"))
    paced.on_pod("ADDED", pod("c", gated=False))  # not ours to release
    first = paced._next()
    assert first is not None and first.name == "b"
    paced.on_pod("MODIFIED", pod("b", gated=False, rv="2"))  # someone else let it go
    second = paced._next()
    assert second is not None and second.name == "a"
    paced.on_pod("DELETED", pod("a"))
    assert paced._next() is None


def test_a_newer_version_of_a_gated_pod_replaces_the_one_in_line() -> None:
    paced = pacer()
    paced.on_pod("ADDED", pod("a"))
    paced.on_pod("MODIFIED", pod("a", rv="5"))
    entry = paced._next()
    assert entry is not None and entry.resource_version == "5"


def test_a_pod_beside_one_its_node_s_labels_do_not_count_goes_only_where_both_fit() -> None:
    paced = pacer()
    paced.on_pod("ADDED", pod("h100-pod"))
    paced.on_pod("ADDED", pod("h200-pod", memory="143771"))
    paced.on_pod("MODIFIED", pod("bound", gated=False, node_name="h100-a"))  # the h100 node's labels lag
    assert set(paced.ledger.lagging) == {"h100-a"}
    entries = {e.name: e for e in paced._queue}
    now = paced.ledger.lagging["h100-a"]
    h100, h200 = (paced._candidates(entries[n]) for n in ("h100-pod", "h200-pod"))
    assert (h100, h200) == ({"h100-a"}, {"h200-a"})
    share = {UNITS: 191}
    # The bound pod and this one touch two GPUs at most, and the labels show two free: no order of
    # admission can refuse either.
    assert paced._has_room(share, h100, now)
    paced.nodes.apply("MODIFIED", node("h100-a", free_gpus=1))  # one free GPU: the two could meet on it
    assert "h100-a" in paced.ledger.lagging and not paced._has_room(share, h100, now)
    assert paced._has_room(share, h200, now)  # another class's node is not in the way
    # A node that lags longer than lagTimeoutSeconds (its kubelet admits nothing) holds no one back.
    # (counted from when it lags as the ledger now records it: the update above may have moved it on)
    since = paced.ledger.lagging["h100-a"]
    assert paced._has_room(share, h100, since + SETTINGS.pacing.lag_timeout_seconds)
    paced.nodes.apply("MODIFIED", node("h100-a", free=636 - 191, free_gpus=1))  # the labels count it now
    assert not paced.ledger.lagging and paced.ledger.unlabelled("h100-a") == []
    assert paced._has_room(share, h100, now)


def test_a_released_pod_stops_counting_in_flight_once_bound_or_found_unschedulable() -> None:
    paced = pacer()
    paced._in_flight = {uid: controller._Flight(1e12, {UNITS: 191}) for uid in "abc"}
    paced._released = {"a", "b", "c"}
    paced.on_pod("MODIFIED", pod("a", gated=False, node_name="h100-a"))
    unschedulable = pod("b", gated=False)
    unschedulable["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    paced.on_pod("MODIFIED", unschedulable)
    paced.on_pod("MODIFIED", pod("c", rv="0"))  # an older event still showing the gate: not queued again
    assert set(paced._in_flight) == {"c"} and paced._next() is None


def test_a_list_orders_pods_not_seen_yet_by_when_they_were_written() -> None:
    paced = controller.Pacer(None, SETTINGS, registry=prometheus_client.CollectorRegistry())  # type: ignore[arg-type]
    paced.replace_pods([pod("a", rv="30"), pod("b", rv="20"), pod("c", rv="100")])
    order = []
    while (entry := paced._next()) is not None:
        order.append(entry.name)
        paced.on_pod("DELETED", pod(entry.name))
    assert order == ["b", "a", "c"]


def test_pods_in_flight_go_together_while_every_node_they_could_share_has_a_free_gpu_for_each() -> None:
    paced = pacer()
    paced.nodes.replace([node("h100-a"), node("h100-b"), node("h200-a", memory="143771")])  # 2 free GPUs each
    for name, memory in (("first", "81559"), ("second", "81559"), ("third", "81559"), ("other", "143771")):
        paced.on_pod("ADDED", pod(name, memory=memory))
    entries = {e.name: e for e in paced._queue}
    share = {UNITS: 191}

    def fly(name: str) -> None:
        paced._in_flight[name] = controller._Flight(1e12, share, paced._candidates(entries[name]))

    assert paced._has_room(share, paced._candidates(entries["first"]), 0)  # nothing in flight
    fly("first")
    assert paced._in_flight["first"].nodes == {"h100-a", "h100-b"}
    # Both could land on h100-a before its labels move, and it has a free GPU for each.
    assert paced._has_room(share, paced._candidates(entries["second"]), 0)
    fly("second")
    # A third could make three on a node of two free GPUs: it waits; the other class does not.
    assert not paced._has_room(share, paced._candidates(entries["third"]), 0)
    assert paced._has_room(share, paced._candidates(entries["other"]), 0)
    # In flight before this pacer knew where it could go (a takeover): it could be anywhere.
    paced._in_flight["unknown-1"] = paced._in_flight["unknown-2"] = controller._Flight(1e12, share)
    assert not paced._has_room(share, paced._candidates(entries["other"]), 0)  # three on h200-a's two
    for name in ("first", "second", "unknown-1", "unknown-2"):
        del paced._in_flight[name]
    assert paced._has_room(share, paced._candidates(entries["third"]), 0)  # they landed: nothing in the way


async def test_a_replica_that_takes_over_counts_pods_released_before_and_not_yet_placed_as_in_flight() -> None:
    paced = pacer()
    paced.set_leading(False)
    paced.on_pod("ADDED", pod("released-by-the-last-leader", gated=False))
    paced.on_pod("ADDED", pod("placed", gated=False, node_name="h100-a"))
    paced.on_pod("ADDED", pod("cpu-only", units=0, gated=False))  # takes no device: cannot be refused
    paced.on_pod("ADDED", pod("waiting"))
    paced.on_pod("ADDED", pod("gone", gated=False))
    paced.on_pod("DELETED", pod("gone", gated=False))
    assert paced._in_flight == {}
    paced.set_leading(True)
    assert set(paced._in_flight) == {"released-by-the-last-leader"}
    entry = paced._next()
    assert entry is not None and entry.name == "waiting"
    # Where it could land is not known: it counts on every node, whichever nodes the next could go to.
    flight = paced._in_flight["released-by-the-last-leader"]
    assert flight.demand == {UNITS: 191} and flight.nodes is None
    paced.nodes.apply("MODIFIED", node("h100-a", free_gpus=1))
    assert not paced._has_room({UNITS: 191}, paced._candidates(entry), 0)
    paced.on_pod("MODIFIED", pod("released-by-the-last-leader", gated=False, node_name="h100-a", rv="2"))
    assert paced._in_flight == {}


async def test_a_standby_releases_nothing() -> None:
    paced = pacer()
    paced.set_leading(False)
    paced.on_pod("ADDED", pod("waiting"))
    released: list[str] = []

    async def release(entry: Any, *_: Any) -> None:
        released.append(entry.name)

    paced._release = release  # type: ignore[method-assign]
    paced.pods.synced.set()
    paced.nodes.synced.set()
    paced.pods.run = paced.nodes.run = asyncio.Event().wait  # type: ignore[method-assign]
    running = asyncio.create_task(paced.run())
    await asyncio.sleep(0.05)
    assert released == []
    paced.set_leading(True)
    await asyncio.sleep(0.05)
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    assert released == ["waiting"]


def test_a_list_in_pages_is_taken_a_page_at_a_time_and_pruned_once_whole() -> None:
    paced = pacer()
    paced.listed_pods([pod("late", rv="9")])  # pages come by name, not by when pods were written
    paced.listed_pods([pod("early", rv="3"), pod("bound", node_name="h100-a", rv="4")])
    assert paced.ledger.unlabelled("h100-a")  # counted as soon as its page came
    paced.replace_pods([])
    first = paced._next()
    assert first is not None and first.name == "early"
    # A relist after an expired watch: "late" and "bound" went meanwhile.
    paced.listed_pods([pod("early", rv="3")])
    paced.replace_pods([])
    assert not paced.ledger.unlabelled("h100-a")
    names = []
    while (entry := paced._next()) is not None:
        names.append(entry.name)
        paced.on_pod("DELETED", pod(entry.name))
    assert names == ["early"]


def test_a_list_that_failed_part_way_counts_only_what_its_retry_shows() -> None:
    paced = pacer()
    paced.pods.list_started()
    paced.listed_pods([pod("bound", node_name="h100-a", rv="4"), pod("gated", rv="5")])
    # The list fails here; both pods are deleted before it starts again, which shows neither.
    paced.pods.list_started()
    paced.listed_pods([pod("other", rv="6")])
    paced.replace_pods([])
    assert not paced.ledger.unlabelled("h100-a")  # "bound" no longer counts on its node
    names = []
    while (entry := paced._next()) is not None:
        names.append(entry.name)
        paced.on_pod("DELETED", pod(entry.name))
    assert names == ["other"]
