"""Kubelet's device-manager record (sim/devicemanager.py) follows devicesToAllocate."""

from __future__ import annotations

import pytest

from gpuslice.sim import devicemanager

IDS = [f"GPU-a::{i}" for i in range(4)] + [f"GPU-b::{i}" for i in range(4)]


def fresh() -> devicemanager.ResourceDevices:
    devices = devicemanager.ResourceDevices("gpuslice.io/gpu-memory")
    devices.update({d: True for d in IDS})
    return devices


def test_available_devices_are_healthy_unallocated_and_sorted():
    devices = fresh()
    devices.update({**{d: True for d in IDS}, "GPU-a::0": False})
    devices.commit("ns/p/c", ["GPU-b::3"])
    assert devices.available() == sorted(set(IDS) - {"GPU-a::0", "GPU-b::3"})
    assert (devices.capacity, devices.allocatable) == (8, 7)


def test_preferred_request_offers_every_free_device_and_no_must_include():
    available, must = fresh().preferred_request(3)
    assert available == sorted(IDS)
    assert must == []


def test_preferred_request_puts_reusable_devices_in_must_include():
    devices = fresh()
    devices.commit("ns/p/init", ["GPU-a::1"])
    available, must = devices.preferred_request(2, reusable=["GPU-a::1"])
    assert must == ["GPU-a::1"]
    assert "GPU-a::1" in available


@pytest.mark.parametrize(
    ("health", "size", "message"),
    [
        ({d: False for d in IDS}, 1, "no healthy devices present"),
        ({d: True for d in IDS[:2]}, 3, "Requested: 3, Available: 2"),
    ],
    ids=["no-healthy-device", "too-few-free-devices"],
)
def test_preferred_request_refuses_like_kubelet(health, size, message):
    devices = devicemanager.ResourceDevices("gpuslice.io/gpu-memory")
    devices.update(health)
    with pytest.raises(devicemanager.AdmissionError, match=message):
        devices.preferred_request(size)


def test_choose_keeps_the_preferred_answer_when_it_is_available():
    assert fresh().choose(2, ["GPU-b::2", "GPU-b::1"]) == ["GPU-b::1", "GPU-b::2"]


def test_choose_falls_back_to_arbitrary_devices_when_the_answer_is_short_or_stale():
    devices = fresh()
    devices.commit("ns/other/c", ["GPU-b::1"])
    chosen = devices.choose(3, ["GPU-b::1", "GPU-b::2", "not-a-device"])
    assert chosen == ["GPU-b::2", "GPU-a::0", "GPU-a::1"]


def test_choose_takes_reusable_devices_first():
    devices = fresh()
    devices.commit("ns/p/init", ["GPU-b::0"])
    assert devices.choose(2, ["GPU-a::3"], reusable=["GPU-b::0"]) == ["GPU-b::0", "GPU-a::3"]


def test_commit_refuses_a_device_held_by_another_pod():
    devices = fresh()
    devices.commit("ns/p/c", ["GPU-a::0"])
    with pytest.raises(devicemanager.AdmissionError, match="already allocated to ns/p/c"):
        devices.commit("ns/q/c", ["GPU-a::0", "GPU-a::1"])
    assert "ns/q/c" not in devices.allocated


def test_containers_of_one_pod_may_share_a_reused_device_and_release_keeps_the_other_holder():
    devices = fresh()
    devices.commit("ns/p/init", ["GPU-a::0"])
    devices.commit("ns/p/app", ["GPU-a::0", "GPU-a::1"])
    assert devices.release("ns/p/init") == ["GPU-a::0"]
    assert devices.holder("GPU-a::0") == "ns/p/app"
    assert "GPU-a::0" not in devices.available()


def test_release_returns_devices_to_the_pool():
    devices = fresh()
    devices.commit("ns/p/c", ["GPU-a::0", "GPU-a::1"])
    assert devices.release("ns/p/c") == ["GPU-a::0", "GPU-a::1"]
    assert devices.available() == sorted(IDS)
    assert devices.release("ns/p/c") == []


def test_allocations_survive_a_plugin_going_away_but_nothing_is_allocatable():
    devices = fresh()
    devices.commit("ns/p/c", ["GPU-a::0"])
    devices.mark_all_unhealthy()
    assert devices.allocatable == 0 and devices.capacity == 8
    assert devices.allocated == {"ns/p/c": ("GPU-a::0",)}
    with pytest.raises(devicemanager.AdmissionError, match="no healthy devices"):
        devices.preferred_request(1)
