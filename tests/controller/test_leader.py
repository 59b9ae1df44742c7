"""Leader election (controller/leader.py) against a fake CoordinationV1Api that keeps Leases and
answers like the API server: 404 when missing, 409 when the version written is not the current one.
Time is a fake monotonic clock, so expiry is tested without waiting."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from typing import Any

import kubernetes
import pytest

from gpuslice import config
from gpuslice.controller import leader

T0 = datetime.datetime(2026, 11, 24, 5, 0, 0, tzinfo=datetime.UTC)  # a whole second: the hard case
KEY = ("gpuslice", "gpuslice-controller")


class FakeLeases:
    def __init__(self) -> None:
        self.stored: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 0
        self.calls: list[str] = []
        self.fail: Exception | None = None

    def _answer(self, body: dict[str, Any]) -> kubernetes.client.V1Lease:
        spec = body["spec"]
        return kubernetes.client.V1Lease(
            metadata=kubernetes.client.V1ObjectMeta(resource_version=body["metadata"]["resourceVersion"]),
            spec=kubernetes.client.V1LeaseSpec(
                holder_identity=spec.get("holderIdentity"),
                lease_duration_seconds=spec.get("leaseDurationSeconds"),
                acquire_time=spec.get("acquireTime"),
                renew_time=spec.get("renewTime"),
                lease_transitions=spec.get("leaseTransitions"),
            ),
        )

    def _write(self, namespace: str, body: dict[str, Any]) -> kubernetes.client.V1Lease:
        self.version += 1
        stored = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.version)}}
        self.stored[namespace, body["metadata"]["name"]] = stored
        return self._answer(stored)

    def read_namespaced_lease(self, name: str, namespace: str) -> Any:
        self.calls.append("read")
        if self.fail is not None:
            raise self.fail
        if (namespace, name) not in self.stored:
            raise kubernetes.client.ApiException(status=404, reason="Not Found")
        return self._answer(self.stored[namespace, name])

    def create_namespaced_lease(self, namespace: str, body: Any) -> Any:
        self.calls.append("create")
        assert "resourceVersion" not in body["metadata"]
        if (namespace, body["metadata"]["name"]) in self.stored:
            raise kubernetes.client.ApiException(status=409, reason="AlreadyExists")
        return self._write(namespace, body)

    def replace_namespaced_lease(self, name: str, namespace: str, body: Any) -> Any:
        self.calls.append("replace")
        if self.fail is not None:
            raise self.fail
        current = self.stored.get((namespace, name))
        if current is None:
            raise kubernetes.client.ApiException(status=404, reason="Not Found")
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise kubernetes.client.ApiException(status=409, reason="Conflict")
        return self._write(namespace, body)

    @property
    def spec(self) -> dict[str, Any]:
        return self.stored[KEY]["spec"]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def replica(api: FakeLeases, identity: str, clock: Clock, seconds: int = 15) -> leader.Leadership:
    wall = iter(T0 + datetime.timedelta(seconds=s) for s in range(10_000))
    return leader.Leadership(
        api,
        name=KEY[1],
        namespace=KEY[0],
        identity=identity,
        lease_seconds=seconds,
        clock=lambda: next(wall),
        monotonic=clock,
    )


def step(election: leader.Leadership) -> bool:
    return asyncio.run(election.step())


def test_the_first_replica_creates_the_lease_and_leads_and_renews_it_with_one_read_and_one_write() -> None:
    api, clock = FakeLeases(), Clock()
    a = replica(api, "a", clock)
    changes: list[bool] = []
    a.watch(changes.append)
    assert step(a) and a.leading and changes == [True]
    assert api.spec["holderIdentity"] == "a" and api.spec["leaseDurationSeconds"] == 15
    assert api.spec["acquireTime"] == api.spec["renewTime"] == "2026-11-24T05:00:00.000000Z"
    clock.now += 5
    assert step(a)
    assert api.calls == ["read", "create", "read", "replace"]
    assert api.spec["renewTime"] == "2026-11-24T05:00:01.000000Z"
    assert api.spec["acquireTime"] == "2026-11-24T05:00:00.000000Z"  # kept while it leads
    assert changes == [True] and a.interval == 5 and a.renew_deadline == 10


def test_a_standby_takes_over_only_once_the_leaders_renewal_has_not_moved_for_the_duration() -> None:
    api, clock = FakeLeases(), Clock()
    a, b = replica(api, "a", clock), replica(api, "b", clock)
    assert step(a) and not step(b)
    clock.now += 14
    assert not step(b)  # first seen 14 s ago by b's clock, whatever the Lease's wall times say
    clock.now += 1
    assert step(b) and b.leading
    assert api.spec["holderIdentity"] == "b" and api.spec["leaseTransitions"] == 1
    # a comes back (it was stuck): it sees b holding, and stops leading at once
    assert not step(a) and not a.leading


def test_a_renewal_resets_the_standbys_clock() -> None:
    api, clock = FakeLeases(), Clock()
    a, b = replica(api, "a", clock), replica(api, "b", clock)
    step(a)
    step(b)
    for _ in range(6):  # 30 s, a renewing every 5
        clock.now += 5
        assert step(a) and not step(b)
    assert api.spec["holderIdentity"] == "a"


def test_of_two_standbys_that_both_see_the_lease_expired_only_one_takes_it() -> None:
    api, clock = FakeLeases(), Clock()
    a, b, c = replica(api, "a", clock), replica(api, "b", clock), replica(api, "c", clock)
    step(a)
    step(b), step(c)
    clock.now += 16
    # Both read the expired Lease before either writes: the second write conflicts.
    expired = api.read_namespaced_lease(KEY[1], KEY[0])
    original = api.read_namespaced_lease
    api.read_namespaced_lease = lambda name, namespace: expired  # type: ignore[method-assign]
    results = [step(b), step(c)]
    api.read_namespaced_lease = original  # type: ignore[method-assign]
    assert results == [True, False] and b.leading and not c.leading
    assert api.spec["holderIdentity"] == "b"


def test_a_leader_that_cannot_renew_stops_leading_before_a_standby_may_take_over() -> None:
    api, clock = FakeLeases(), Clock()
    a = replica(api, "a", clock)
    changes: list[bool] = []
    a.watch(changes.append)
    step(a)
    api.fail = ConnectionError("refused")
    clock.now += 5
    assert step(a)  # within the renew deadline: still leading
    clock.now += 5
    assert not step(a) and changes == [True, False]  # 10 s = two thirds of 15: stopped
    api.fail = None
    assert step(a) and changes == [True, False, True]  # its own Lease, not yet taken: taken again


def test_a_leader_that_stops_gives_the_lease_up_and_a_standby_takes_it_at_its_next_look() -> None:
    api, clock = FakeLeases(), Clock()
    a, b = replica(api, "a", clock), replica(api, "b", clock)

    async def leads_then_stops() -> None:
        task = asyncio.create_task(a.run())
        while not a.leading:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(leads_then_stops())
    assert not a.leading and api.spec["holderIdentity"] == "" and api.spec["leaseDurationSeconds"] == 1
    assert step(b) and api.spec["holderIdentity"] == "b"  # no wait for the duration


def test_an_unreachable_api_server_leaves_a_standby_standing_by() -> None:
    api, clock = FakeLeases(), Clock()
    b = replica(api, "b", clock)
    api.fail = kubernetes.client.ApiException(status=500, reason="Internal Server Error")
    assert not step(b) and api.stored == {}


def test_the_lease_keys_default_to_the_pods_own_namespace() -> None:
    controller = config.ControllerConfig()
    assert (controller.lease_name, controller.lease_seconds) == ("gpuslice-controller", 15)
    assert controller.lease_namespace_in({"POD_NAMESPACE": "gpuslice"}) == "gpuslice"
    assert controller.lease_namespace_in({}) == "default"
    assert dataclasses.replace(controller, lease_namespace="ops").lease_namespace_in({"POD_NAMESPACE": "x"}) == "ops"
    with pytest.raises(config.ConfigError, match="controller.leaseName"):
        config.load(None, environ={"GPUSLICE_CONTROLLER_LEASE_NAME": "Not_A_Name"})
    with pytest.raises(config.ConfigError, match="controller.leaseSeconds"):
        config.load(None, environ={"GPUSLICE_CONTROLLER_LEASE_SECONDS": "0"})
