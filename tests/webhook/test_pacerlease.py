"""The webhook reads the pacer's Lease (webhook/pacerlease.py) and gates pods only while a pacer
renews it: a fake CoordinationV1Api and hand-driven clocks; the real API server in
tests/e2e/test_real_pacer.py."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime
import json

import kubernetes
import orjson
import pytest
import test_repeats
from test_mutation import make_view

from gpuslice import config
from gpuslice.webhook import cluster, pacerlease, repeats, server

PACED = dataclasses.replace(config.Config(), pacing=config.PacingConfig(enabled=True))
NOW = datetime.datetime(2026, 11, 24, 5, 0, 0, tzinfo=datetime.UTC)


class FakeLeases:
    """One Lease, or a failure to answer with."""

    def __init__(self) -> None:
        self.renewed: datetime.datetime | None = None
        self.holder = "pacer-0"
        self.duration: int | None = 15
        self.fail: Exception | None = None

    def read_namespaced_lease(self, name: str, namespace: str) -> kubernetes.client.V1Lease:
        assert (namespace, name) == ("gpuslice", "gpuslice-pacer")
        if self.fail is not None:
            raise self.fail
        if self.renewed is None:
            raise kubernetes.client.ApiException(status=404, reason="Not Found")
        spec = kubernetes.client.V1LeaseSpec(
            holder_identity=self.holder, lease_duration_seconds=self.duration, renew_time=self.renewed
        )
        return kubernetes.client.V1Lease(metadata=kubernetes.client.V1ObjectMeta(name=name), spec=spec)


class Clocks:
    def __init__(self) -> None:
        self.elapsed = 0.0

    def monotonic(self) -> float:
        return 1000.0 + self.elapsed

    def wall(self) -> datetime.datetime:
        return NOW + datetime.timedelta(seconds=self.elapsed)


@dataclasses.dataclass
class Reader:
    api: FakeLeases
    clocks: Clocks
    view: cluster.ClusterView
    lease: pacerlease.PacerLease

    def check(self, after: float = 0.0) -> bool:
        self.clocks.elapsed += after
        asyncio.run(self.lease.check())
        return self.view.pacer_alive


def reader() -> Reader:
    api, clocks, view = FakeLeases(), Clocks(), make_view(settings=PACED)
    lease = pacerlease.PacerLease(
        api,
        view,
        name="gpuslice-pacer",
        namespace="gpuslice",
        lease_seconds=15,
        monotonic=clocks.monotonic,
        wall=clocks.wall,
    )
    return Reader(api, clocks, view, lease)


def test_a_pacer_is_alive_until_its_last_renewal_lapses() -> None:
    r = reader()
    r.api.renewed = NOW - datetime.timedelta(seconds=5)
    assert r.check()
    assert r.check(after=9.0)  # 14 s old
    assert not r.check(after=2.0)  # 16 s old: gone
    assert r.view.pacer_absent == "no pacer alive: Lease gpuslice/gpuslice-pacer not renewed within 15 s"
    r.api.renewed = r.clocks.wall()  # renewed again
    assert r.check()


def test_a_renewal_counts_from_when_it_is_seen_whatever_the_pacers_clock_says() -> None:
    r = reader()
    behind = datetime.timedelta(hours=1)
    r.api.renewed = NOW - behind  # the first read: an hour old by this clock
    assert not r.check()
    r.api.renewed = r.clocks.wall() - behind + datetime.timedelta(seconds=5)  # but it moves
    assert r.check(after=5.0)
    assert r.check(after=14.0)
    assert not r.check(after=2.0)  # not moved for 16 s


def test_the_lease_says_how_long_a_renewal_holds() -> None:
    r = reader()
    r.api.renewed, r.api.duration = NOW, 4
    assert r.check()
    assert not r.check(after=5.0)
    assert "within 4 s" in r.view.pacer_absent


def test_a_missing_lease_means_no_pacer() -> None:
    r = reader()
    r.api.renewed = NOW
    assert r.check()
    r.api.renewed = None  # deleted
    assert not r.check(after=1.0)
    assert "not found" in r.view.pacer_absent


@pytest.mark.parametrize(
    "failure",
    [kubernetes.client.ApiException(status=403, reason="Forbidden"), ConnectionError("refused")],
    ids=["forbidden", "unreachable"],
)
def test_a_lease_that_cannot_be_read_keeps_the_last_judgement_until_it_lapses(failure: Exception) -> None:
    r = reader()
    assert not r.check(after=0.0)  # 404 first
    r.api.renewed = NOW
    assert r.check()
    r.api.fail = failure
    assert r.check(after=10.0)
    assert not r.check(after=6.0)


def test_a_change_of_liveness_is_a_new_generation_of_the_view() -> None:
    r = reader()
    r.api.renewed = NOW
    before = r.view.generation
    r.check()
    alive = r.view.generation
    assert alive != before
    r.check(after=1.0)
    assert r.view.generation == alive  # still alive: remembered answers hold
    r.check(after=20.0)
    assert r.view.generation != alive


def _gated(result: tuple[object, bytes]) -> bool:
    response = orjson.loads(result[1])["response"]
    patch = json.loads(base64.b64decode(response["patch"]))
    return any(op["path"].startswith("/spec/schedulingGates") for op in patch)


def test_a_gated_answer_remembered_while_a_pacer_lived_is_not_given_once_it_is_gone() -> None:
    # The replicas of a Deployment repeat one body: the answer to it is remembered (webhook/repeats.py).
    r = reader()
    r.api.renewed = NOW
    r.check()
    answers = repeats.RepeatAnswers()

    def review(uid: str) -> tuple[object, bytes]:
        return answers.review(test_repeats.body(uid, {"gpu-memory": "20000"}), settings=PACED, cluster=r.view)

    assert all(_gated(review(f"u-{i}")) for i in range(4))
    assert answers.repeats == 2  # the first is reviewed, the second remembered
    r.check(after=20.0)  # the pacer died
    assert not _gated(review("u-after"))


def test_the_metrics_say_whether_a_pacer_is_alive() -> None:
    view = make_view(settings=PACED)
    app = server.make_app(PACED, view)
    assert b"gpuslice_webhook_pacer_alive 0.0" in app[server.METRICS].exposition()[0]
    view.set_pacer("")
    assert b"gpuslice_webhook_pacer_alive 1.0" in app[server.METRICS].exposition()[0]
