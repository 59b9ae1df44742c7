"""gpuslice.podrequests counts a pod as kube-scheduler 1.37 does (component-helpers' PodRequests
with the scheduler's default gates): the cases below are the rule's, each with its figure worked
by hand."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from kubernetes.utils import quantity

from gpuslice import podrequests

NAMES = frozenset({"cpu", "memory"})


def read(name: str, value: Any) -> Decimal:
    return quantity.parse_quantity(value)


def cpu(spec_or_pod: dict[str, Any], *, on_node: bool = True) -> Decimal:
    if on_node:
        return podrequests.on_node(spec_or_pod, read, NAMES).get("cpu", Decimal(0))
    return podrequests.new_pod(spec_or_pod, requests_of, read, NAMES).get("cpu", Decimal(0))


def requests_of(container: dict[str, Any]) -> dict[str, Decimal]:
    return {n: read(n, v) for n, v in ((container.get("resources") or {}).get("requests") or {}).items() if n in NAMES}


def container(name: str, cores: str, *, sidecar: bool = False) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "resources": {"requests": {"cpu": cores}}}
    if sidecar:
        entry["restartPolicy"] = "Always"
    return entry


def test_sidecars_add_to_the_containers_and_an_init_container_runs_beside_the_sidecars_before_it():
    spec = {
        "containers": [container("app", "2")],
        "initContainers": [
            container("setup", "1"),  # alone: 1
            container("proxy", "1", sidecar=True),  # runs on beside everything after it
            container("migrate", "2.5"),  # beside the proxy: 3.5, more than app + proxy (3)
        ],
    }
    assert cpu({"spec": spec}) == Decimal("3.5")
    spec["initContainers"][2] = container("migrate", "1")  # beside the proxy: 2, less than 3
    assert cpu({"spec": spec}) == 3
    # An ordinary init container before the sidecar does not run beside it.
    spec["initContainers"] = [container("migrate", "2.5"), container("proxy", "1", sidecar=True)]
    assert cpu({"spec": spec}) == 3


def test_null_entries_and_missing_requests_count_nothing():
    spec = {"containers": [None, {"name": "a"}, container("b", "1")], "initContainers": [None]}
    assert cpu({"spec": spec}) == 1
    assert podrequests.on_node({}, read, NAMES) == {}


def test_pod_level_requests_replace_the_containers_figure_of_the_resources_they_name_and_overhead_adds():
    spec: dict[str, Any] = {
        "containers": [{"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
        "resources": {"requests": {"memory": "4Gi"}},
        "overhead": {"cpu": "100m", "memory": "64Mi"},
    }
    counted = podrequests.new_pod(spec, requests_of, read, NAMES)
    assert counted == {"cpu": Decimal("1.1"), "memory": Decimal(4 * 2**30 + 64 * 2**20)}
    assert podrequests.on_node({"spec": spec}, read, NAMES) == counted


def resized(spec_cores: str, *, allocated: str | None, running: str | None, reason: str | None = None) -> dict:
    status: dict[str, Any] = {"name": "a"}
    if allocated is not None:
        status["allocatedResources"] = {"cpu": allocated}
    if running is not None:
        status["resources"] = {"requests": {"cpu": running}}
    pod: dict[str, Any] = {
        "spec": {"containers": [container("a", spec_cores)]},
        "status": {"phase": "Running", "containerStatuses": [status]},
    }
    if reason is not None:
        pod["status"]["conditions"] = [{"type": "PodResizePending", "status": "True", "reason": reason}]
    return pod


def test_an_in_place_resize_counts_at_its_larger_side_until_kubelet_has_carried_it_out():
    assert cpu(resized("1", allocated="2", running="2")) == 2  # asked down: still runs at 2
    assert cpu(resized("4", allocated="2", running="2", reason="Deferred")) == 4  # asked up: counted at once
    assert cpu(resized("4", allocated="4", running="2")) == 4
    assert cpu(resized("1", allocated="1", running="1")) == 1  # done
    assert cpu(resized("1", allocated=None, running=None)) == 1  # no status yet: the spec
    # Infeasible: kubelet will not do it, so the ask does not count; what runs does.
    assert cpu(resized("8", allocated="2", running="2", reason="Infeasible")) == 2
    assert cpu(resized("8", allocated=None, running=None, reason="Infeasible")) == 0


def test_kubelets_pod_level_sums_are_read_when_both_are_published():
    pod = resized("1", allocated="1", running="1")
    pod["status"]["allocatedResources"] = {"cpu": "3"}
    pod["status"]["resources"] = {"requests": {"cpu": "2"}}
    assert cpu(pod) == 3
    del pod["status"]["allocatedResources"]  # only one published: the containers' statuses count
    assert cpu(pod) == 1


def test_a_pod_level_resize_counts_at_its_larger_side():
    pod = resized("1", allocated="1", running="1")
    pod["spec"]["resources"] = {"requests": {"cpu": "2"}}
    assert cpu(pod) == 2  # no pod-level status: the spec's pod-level figure
    pod["status"]["resources"] = {"requests": {"cpu": "3"}}
    assert cpu(pod) == 3  # still runs with 3
    pod["status"]["conditions"] = [{"type": "PodResizePending", "reason": "Infeasible"}]
    pod["spec"]["resources"] = {"requests": {"cpu": "8"}}
    assert cpu(pod) == 3


def test_a_new_pod_is_counted_from_its_spec_alone():
    spec = {"containers": [container("a", "1")], "initContainers": [container("p", "1", sidecar=True)]}
    assert cpu(spec, on_node=False) == 2
