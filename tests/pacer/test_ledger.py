"""Which nodes lag the pods bound to them (pacer/ledger.py)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice import contract as contract_
from gpuslice.pacer import ledger

CONTRACT = contract_.Contract()
UNITS = CONTRACT.gpu_memory_resource
MIG = CONTRACT.mig_resource("1g.10gb")


def node(
    name: str, *, units: int = 636, free: int | None = None, mig: int = 0, mig_free: int | None = None
) -> dict[str, Any]:
    allocatable = {"cpu": "64", UNITS: str(units)}
    labels = {CONTRACT.label_free_units: str(units if free is None else free)}
    if mig:
        allocatable[MIG] = str(mig)
        labels[CONTRACT.free_label_of_resource(MIG) or ""] = str(mig if mig_free is None else mig_free)
    return {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": allocatable}}


def pod(
    uid: str, node_name: str = "", *, units: int = 0, mig: int = 0, phase: str = "Pending", init: int = 0
) -> dict[str, Any]:
    limits = {"cpu": "1"}
    if units:
        limits[UNITS] = str(units)
    if mig:
        limits[MIG] = str(mig)
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"limits": limits}}]}
    if init:
        spec["initContainers"] = [{"name": "init", "resources": {"requests": {UNITS: str(init)}}}]
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"uid": uid, "name": uid}, "spec": spec, "status": {"phase": phase}}


def test_a_node_lags_from_a_binding_until_its_labels_count_the_pod() -> None:
    book = ledger.Ledger(CONTRACT)
    book.update_node(node("n1"))
    assert not book.lagging
    book.update_pod(pod("a", "n1", units=191))
    assert set(book.lagging) == {"n1"}  # bound; the labels still say 636 free
    book.update_node(node("n1", free=636 - 191))
    assert not book.lagging


def test_events_in_either_order_give_the_same_answer() -> None:
    book = ledger.Ledger(CONTRACT)
    book.update_node(node("n1"))
    book.update_node(node("n1", free=445))  # the labeller was faster than the pod watch
    assert not book.lagging
    book.update_pod(pod("a", "n1", units=191))
    assert not book.lagging


def test_a_pod_that_ends_or_is_refused_stops_counting_and_never_makes_a_node_lag() -> None:
    book = ledger.Ledger(CONTRACT)
    book.update_node(node("n1", free=445))
    book.update_pod(pod("a", "n1", units=191, phase="Running"))
    assert not book.lagging
    book.update_pod(pod("b", "n1", units=191))
    assert set(book.lagging) == {"n1"}
    book.update_pod(pod("b", "n1", units=191, phase="Failed"))  # kubelet refused it (or it finished)
    # The labels still say 445 free, kubelet has 636 - 191: they do not promise more than there is.
    assert not book.lagging


def test_labels_that_promise_less_than_is_free_are_not_lagging() -> None:
    book = ledger.Ledger(CONTRACT)
    book.update_node(node("n1", free=100))
    assert not book.lagging
    book.update_pod(pod("a", "n1", units=191, phase="Running"))
    book.forget_pod("a")
    assert not book.lagging


def test_mig_devices_count_like_units() -> None:
    book = ledger.Ledger(CONTRACT)
    book.update_node(node("n1", mig=7))
    book.update_pod(pod("m", "n1", mig=1))
    assert set(book.lagging) == {"n1"}
    book.update_node(node("n1", mig=7, mig_free=6))
    assert not book.lagging


def test_an_init_container_counts_only_when_larger_than_the_app_containers() -> None:
    assert ledger.pod_demand(pod("a", units=10, init=30)["spec"], CONTRACT) == {UNITS: 30}
    assert ledger.pod_demand(pod("a", units=40, init=30)["spec"], CONTRACT) == {UNITS: 40}
    assert ledger.pod_demand(pod("a")["spec"], CONTRACT) == {}


def test_a_sidecar_holds_its_units_beside_the_app_containers() -> None:
    spec = pod("a", units=40, init=30)["spec"]
    spec["initContainers"][0]["restartPolicy"] = "Always"  # runs on beside main: 40 + 30
    assert ledger.pod_demand(spec, CONTRACT) == {UNITS: 70}


@pytest.mark.parametrize(("value", "count"), [("40", 40), ("2k", 2000), ("1e3", 1000)])
def test_a_count_is_read_in_any_form_the_api_server_writes(value: str, count: int) -> None:
    # The API server stores a count of 2,000 units (a node's allocatable, a large pod's request) as "2k".
    spec = {"containers": [{"resources": {"limits": {UNITS: value}}}]}
    assert ledger.pod_demand(spec, CONTRACT) == {UNITS: count}


@pytest.mark.parametrize("value", ["1.5", "-3", "1500m", "١٢", "", "9" * 40])
def test_quantities_that_are_not_plain_counts_are_ignored(value: str) -> None:
    spec = {"containers": [{"resources": {"limits": {UNITS: value}}}]}
    assert ledger.pod_demand(spec, CONTRACT) == {}


def test_a_node_without_free_labels_never_lags_and_unbound_pods_never_count() -> None:
    book = ledger.Ledger(CONTRACT)
    bare = node("n1")
    bare["metadata"]["labels"] = {}
    book.update_node(bare)
    book.update_pod(pod("a", "n1", units=191))
    book.update_pod(pod("b", units=191))
    assert not book.lagging


def test_a_relist_forgets_pods_gone_meanwhile_and_keeps_the_demand_of_nodes_not_yet_listed() -> None:
    book = ledger.Ledger(CONTRACT)
    book.update_node(node("n1"))
    book.update_pod(pod("a", "n1", units=191))
    book.update_pod(pod("b", "n2", units=191))
    book.replace_pods([pod("b", "n2", units=191)])
    assert not book.lagging  # a is gone; n2 is not known yet
    book.replace_nodes([node("n1"), node("n2")])
    assert set(book.lagging) == {"n2"}
    book.remove_node("n2")
    assert not book.lagging


def test_a_node_lags_since_the_first_moment_its_labels_fell_behind() -> None:
    now = [10.0]
    book = ledger.Ledger(CONTRACT, clock=lambda: now[0])
    book.update_node(node("n1"))
    book.update_pod(pod("a", "n1", units=191))
    now[0] = 12.0
    book.update_pod(pod("b", "n1", units=10))
    assert book.lagging == {"n1": 10.0}
    book.update_node(node("n1", free=636 - 201))
    assert book.lagging == {}


def test_while_a_node_lags_the_pods_its_labels_may_not_count_are_named() -> None:
    book = ledger.Ledger(CONTRACT)
    book.update_node(node("n1"))
    book.update_pod(pod("a", "n1", units=191))
    book.update_pod(pod("b", "n1", units=100))
    assert book.unlabelled("n1") == [{UNITS: 191}, {UNITS: 100}]
    book.forget_pod("b")  # deleted, or refused: it will never be in the labels
    assert book.unlabelled("n1") == [{UNITS: 191}]
    book.update_node(node("n1", free=636 - 191))  # caught up: the labels count every pod bound to it
    assert book.unlabelled("n1") == [] and book.unlabelled("unknown") == []
    book.update_node(node("n1", free=636 - 191 - 50))  # the labels ahead of the watch: no lag at all
    book.update_pod(pod("c", "n1", units=50))
    assert not book.lagging and book.unlabelled("n1") == []
