"""What the class choice reads of a pod's requests (webhook/pods.py): the scheduler's sums, with
values it could not use counted as 0, the same however often a value comes."""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice.webhook import pods


def spec(*requests: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    def containers(amounts: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
        return [{"name": f"c{i}", "resources": {"requests": a}} for i, a in enumerate(amounts)]

    return {"containers": containers(requests), "initContainers": containers(init)}


def test_requests_sum_the_containers_and_take_the_largest_init_container() -> None:
    assert pods.requests(spec({"cpu": "1", "memory": "1Gi"}, {"cpu": "500m", "memory": "512Mi"})) == (1500, 1536)
    assert pods.requests(spec({"cpu": "1"}, init=({"cpu": "4", "memory": "2Gi"},))) == (4000, 2048)


def test_requests_count_sidecars_pod_level_requests_and_overhead_as_the_scheduler_does() -> None:
    with_sidecar = spec({"cpu": "2", "memory": "4Gi"}, init=({"cpu": "1", "memory": "1Gi"},))
    with_sidecar["initContainers"][0]["restartPolicy"] = "Always"
    assert pods.requests(with_sidecar) == (3000, 5120)
    with_sidecar["resources"] = {"requests": {"memory": "8Gi"}}  # pod-level: replaces the memory only
    with_sidecar["overhead"] = {"cpu": "250m", "memory": "64Mi"}
    assert pods.requests(with_sidecar) == (3250, 8256)


@pytest.mark.parametrize("order", [(1, True), (True, 1), (1.0, True)], ids=["int-first", "bool-first", "float-first"])
def test_a_boolean_request_counts_as_zero_whatever_came_before(order: tuple[Any, Any]) -> None:
    # The memo must not take True for 1 (they hash alike): the API server would refuse a boolean.
    answers = [pods.requests(spec({"cpu": value})) for value in order]
    assert answers == [(1000 if value is not True else 0, 0) for value in order]


def test_requests_that_cannot_be_read_count_as_zero() -> None:
    assert pods.requests(spec({"cpu": "lots", "memory": ["1Gi"]})) == (0, 0)


def test_null_container_entries_are_skipped() -> None:
    # The pod type check lets null list entries through (null counts as absent); reading them was a 500.
    assert pods.requests(
        {"containers": [None, {"resources": {"requests": {"cpu": "2"}}}], "initContainers": [None]}
    ) == (
        2000,
        0,
    )
