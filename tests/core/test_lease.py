"""The Lease protocol's pure part (gpuslice/lease.py): reading a Lease, when a renewal lapses, the
time format. The election and the webhook's reader over it: tests/controller/test_leader.py and
tests/webhook/test_pacerlease.py."""

from __future__ import annotations

import datetime

import kubernetes
import pytest

from gpuslice import lease

T0 = datetime.datetime(2026, 11, 24, 5, 0, 0, tzinfo=datetime.UTC)  # a whole second: the hard case


def v1_lease(holder: str | None = "a", renewed: datetime.datetime | None = T0, duration: int | None = 15) -> object:
    spec = kubernetes.client.V1LeaseSpec(
        holder_identity=holder, renew_time=renewed, lease_duration_seconds=duration, lease_transitions=3
    )
    return kubernetes.client.V1Lease(metadata=kubernetes.client.V1ObjectMeta(resource_version="42"), spec=spec)


def test_micro_time_always_has_six_fraction_digits() -> None:
    assert lease.micro_time(T0) == "2026-11-24T05:00:00.000000Z"
    offset = datetime.timezone(datetime.timedelta(hours=2))
    moment = datetime.datetime(2026, 1, 1, 2, 0, 0, 5, tzinfo=offset)
    assert lease.micro_time(moment) == "2026-01-01T00:00:00.000005Z"


def test_a_read_says_holder_renewal_duration_transitions_and_version() -> None:
    observed = lease.observe(v1_lease())
    assert (observed.holder, observed.renew_time, observed.duration) == ("a", T0, 15)
    assert (observed.transitions, observed.version) == (3, "42")
    assert observed.renewal == ("a", str(T0))


@pytest.mark.parametrize("duration", [None, 0, -5])
def test_a_lease_without_a_usable_duration_holds_for_the_readers_own(duration: int | None) -> None:
    observed = lease.observe(v1_lease(duration=duration))
    assert observed.duration is None and lease.duration_of(observed, 9) == 9


def test_an_empty_lease_reads_as_held_by_nobody() -> None:
    observed = lease.observe(object())
    assert (observed.holder, observed.renew_time, observed.version, observed.renewal) == ("", None, "", ("", ""))
    assert lease.duration_of(None, 7) == 7


def test_a_renewal_holds_for_the_duration_from_when_it_is_first_seen() -> None:
    renewals = lease.Renewals()
    assert not renewals.held(0.0, 15)  # nothing seen
    assert renewals.saw(("a", "t1"), 100.0)
    assert renewals.held(114.9, 15) and not renewals.held(115.0, 15)
    assert not renewals.saw(("a", "t1"), 110.0)  # the same renewal read again: still counts from 100
    assert not renewals.held(115.0, 15)
    assert renewals.saw(("a", "t2"), 112.0)  # a new renewal counts from when it is seen
    assert renewals.held(126.0, 15)
    assert renewals.saw(("b", "t2"), 113.0)  # a new holder is a new renewal too


def test_a_renewal_already_old_when_first_seen_lapses_that_much_sooner() -> None:
    renewals = lease.Renewals()
    renewals.saw(("a", "t1"), 100.0, age=10.0)
    assert renewals.held(104.9, 15) and not renewals.held(105.0, 15)


def test_a_forgotten_renewal_holds_nothing() -> None:
    renewals = lease.Renewals()
    renewals.saw(("a", "t1"), 100.0)
    renewals.forget()
    assert renewals.seen is None and not renewals.held(100.0, 15)


def test_a_renewals_age_is_by_the_wall_clock_and_never_negative() -> None:
    assert lease.age_of(T0, T0 + datetime.timedelta(seconds=30)) == 30.0
    assert lease.age_of(T0.replace(tzinfo=None), T0 + datetime.timedelta(seconds=1)) == 1.0  # no zone: UTC
    assert lease.age_of(T0, T0 - datetime.timedelta(seconds=5)) == 0.0  # the writer's clock is ahead
    assert lease.age_of(None, T0) == 0.0
