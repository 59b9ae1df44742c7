"""The pacer's Lease (pacer/heartbeat.py) against a fake CoordinationV1Api that keeps one Lease and
answers like the API server: 404 when missing, 409 when the version written is not the current one."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from typing import Any

import kubernetes
import pytest

from gpuslice import config
from gpuslice.pacer import controller, heartbeat

T0 = datetime.datetime(2026, 11, 24, 5, 0, 0, tzinfo=datetime.UTC)  # a whole second: the hard case


class FakeLeases:
    def __init__(self) -> None:
        self.stored: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 0
        self.calls: list[str] = []
        self.fail: Exception | None = None

    def _answer(self, body: dict[str, Any]) -> kubernetes.client.V1Lease:
        return kubernetes.client.V1Lease(
            metadata=kubernetes.client.V1ObjectMeta(resource_version=body["metadata"]["resourceVersion"])
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


def beating(api: FakeLeases, times: list[datetime.datetime]) -> heartbeat.Heartbeat:
    return heartbeat.Heartbeat(
        api, name="gpuslice-pacer", namespace="gpuslice", identity="pacer-0", lease_seconds=15, clock=times.pop
    )


def test_the_first_beat_creates_the_lease_and_the_next_ones_renew_it_in_one_call() -> None:
    api = FakeLeases()
    beat = beating(api, [T0 + datetime.timedelta(seconds=5), T0])
    assert asyncio.run(beat.beat())
    spec = api.stored["gpuslice", "gpuslice-pacer"]["spec"]
    assert spec == {"holderIdentity": "pacer-0", "leaseDurationSeconds": 15, "renewTime": "2026-11-24T05:00:00.000000Z"}
    assert asyncio.run(beat.beat())
    assert api.stored["gpuslice", "gpuslice-pacer"]["spec"]["renewTime"] == "2026-11-24T05:00:05.000000Z"
    assert api.calls == ["read", "create", "replace"]
    assert beat.renewals == 2 and beat.interval == 5


def test_a_lease_left_by_an_earlier_pacer_is_taken_over() -> None:
    api = FakeLeases()
    asyncio.run(beating(api, [T0]).beat())  # a pacer that went ...
    asyncio.run(beating(api, [T0 + datetime.timedelta(seconds=60)]).beat())  # ... and its successor
    assert api.stored["gpuslice", "gpuslice-pacer"]["spec"]["renewTime"] == "2026-11-24T05:01:00.000000Z"
    assert api.calls == ["read", "create", "read", "replace"]


def test_a_conflict_or_an_unreachable_api_server_is_retried_at_the_next_beat() -> None:
    api = FakeLeases()
    times = [T0 + datetime.timedelta(seconds=s) for s in (10, 5, 0)]
    beat = beating(api, times)
    assert asyncio.run(beat.beat())
    api.version += 1  # someone else wrote it
    api.stored["gpuslice", "gpuslice-pacer"]["metadata"]["resourceVersion"] = str(api.version)
    assert not asyncio.run(beat.beat())  # 409
    api.fail = ConnectionError("refused")
    assert not asyncio.run(beat.beat())
    api.fail = None
    assert asyncio.run(beat.beat())  # read again, then renewed
    assert api.stored["gpuslice", "gpuslice-pacer"]["spec"]["renewTime"] == "2026-11-24T05:00:10.000000Z"
    assert beat.renewals == 2 and api.calls[-2:] == ["read", "replace"]


class _Listed:
    """A watch that has listed at once and then waits (the pacer's feeds, without a cluster)."""

    def __init__(self) -> None:
        self.synced = asyncio.Event()
        self.synced.set()

    async def run(self) -> None:
        await asyncio.Event().wait()

    def stop(self) -> None:
        pass


@pytest.mark.parametrize("listed", [False, True], ids=["before-listing", "once-listed"])
def test_the_pacer_renews_only_once_its_watches_have_listed(listed: bool) -> None:
    api = FakeLeases()
    beat = heartbeat.Heartbeat(api, name="l", namespace="n", identity="p", lease_seconds=15)
    settings = dataclasses.replace(config.Config(), pacing=config.PacingConfig(enabled=True))
    pacer = controller.Pacer(None, settings, heartbeat=beat)  # type: ignore[arg-type]
    watches = (_Listed(), _Listed())
    if not listed:
        watches[0].synced.clear()
    pacer.pods, pacer.nodes = watches  # type: ignore[assignment]

    async def scenario() -> None:
        task = asyncio.create_task(pacer.run())
        for _ in range(20):
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    assert (beat.renewals == 1) is listed


def test_micro_time_always_has_six_fraction_digits() -> None:
    assert heartbeat.micro_time(T0) == "2026-11-24T05:00:00.000000Z"
    offset = datetime.timezone(datetime.timedelta(hours=2))
    moment = datetime.datetime(2026, 1, 1, 2, 0, 0, 5, tzinfo=offset)
    assert heartbeat.micro_time(moment) == "2026-01-01T00:00:00.000005Z"


def test_the_lease_keys_default_to_the_pods_own_namespace() -> None:
    pacing = config.PacingConfig()
    assert (pacing.lease_name, pacing.lease_seconds) == ("gpuslice-pacer", 15)
    assert pacing.lease_namespace_in({"POD_NAMESPACE": "gpuslice"}) == "gpuslice"
    assert pacing.lease_namespace_in({}) == "default"
    assert dataclasses.replace(pacing, lease_namespace="ops").lease_namespace_in({"POD_NAMESPACE": "x"}) == "ops"
    with pytest.raises(config.ConfigError, match="pacing.leaseName"):
        config.load(None, environ={"GPUSLICE_PACING_LEASE_NAME": "Not_A_Name"})
    with pytest.raises(config.ConfigError, match="pacing.leaseSeconds"):
        config.load(None, environ={"GPUSLICE_PACING_LEASE_SECONDS": "0"})
