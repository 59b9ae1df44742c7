"""NVML's per-process view (the fake NVML) joined with pods (deviceplugin/attribution.py): which
container uses what, what no grant covers and why, NVML errors, a GPU that falls off the bus, and
memory pressure."""

from __future__ import annotations

import pytest
from fake_nvml import FakeNvml

from gpuslice import contract
from gpuslice.deviceplugin import attribution, cgroups, gpu_usage, podapi
from gpuslice.node import podresources

H100_A = "GPU-21302f2a-76fb-5940-b684-dae50f92c162"
H100_B = "GPU-eeca949e-f642-56d1-9ca3-6efaa80acfb1"
MIG_1G = "MIG-1ccf2998-6a5b-590c-8152-c9dc5eb13434"
A100 = "GPU-7a6a7324-0d4c-5ca7-b8a7-1220b7b466f9"
NAMES = contract.Contract()
UID_A, UID_B, UID_C = (f"{c * 8}-{c * 4}-4{c * 3}-8{c * 3}-{c * 12}" for c in "abc")
CID_A, CID_B, CID_C, CID_SIDECAR = ("1" * 64, "2" * 64, "3" * 64, "4" * 64)


@pytest.fixture
def nvml(demo_node) -> FakeNvml:
    fake = FakeNvml(demo_node)
    fake.nvmlInit()
    return fake


def units(gpu: str, count: int, start: int = 0) -> tuple[str, ...]:
    return tuple(contract.unit_device_id(gpu, i, contract.DEFAULT_UNIT_MIB) for i in range(start, start + count))


def holdings() -> list[podresources.ContainerDevices]:
    """pod-a/main: 16 units (4096 MiB) of H100_A; pod-b/main: 32 units of H100_A;
    pod-c/main: a 1g.10gb MIG device."""
    return [
        podresources.ContainerDevices("team", "pod-a", "main", NAMES.gpu_memory_resource, units(H100_A, 16)),
        podresources.ContainerDevices("team", "pod-b", "main", NAMES.gpu_memory_resource, units(H100_A, 32, 16)),
        podresources.ContainerDevices("team", "pod-c", "main", NAMES.mig_resource("1g.10gb"), (MIG_1G,)),
    ]


def pods() -> list[podapi.PodInfo]:
    return [
        podapi.PodInfo(UID_A, "team", "pod-a", {CID_A: "main", CID_SIDECAR: "sidecar"}),
        podapi.PodInfo(UID_B, "team", "pod-b", {CID_B: "main"}),
        podapi.PodInfo(UID_C, "team", "pod-c", {CID_C: "main"}),
    ]


def identity(pid: int, uid: str | None, cid: str = "") -> cgroups.Identity:
    return cgroups.Identity(pid, 1000 + pid, cgroups.ContainerRef(uid, cid) if uid else None)


def snapshot_of(nvml, demo_node, identities) -> attribution.Snapshot:
    samples = gpu_usage.UsageReader(nvml, gpu_usage.shared_devices(demo_node)).read()
    grants = attribution.grants_of(holdings(), demo_node, NAMES)
    return attribution.attribute(samples, identities, pods(), grants)


def use_of(snapshot, pod: str, device: str) -> attribution.ContainerUse:
    (found,) = [u for u in snapshot.containers if u.pod == pod and u.device == device]
    return found


def device_of(snapshot, uuid: str) -> attribution.DeviceUse:
    (found,) = [d for d in snapshot.devices if d.uuid == uuid]
    return found


def test_grants_come_from_the_unit_ids_and_mig_devices_kubelet_assigned(demo_node):
    grants = attribution.grants_of(
        [
            *holdings(),
            podresources.ContainerDevices("x", "stale", "c", NAMES.gpu_memory_resource, ("GPU-gone::3", "not-an-id")),
        ],
        demo_node,
        NAMES,
    )
    assert grants == {
        ("team", "pod-a", "main"): {H100_A: 16 * 256},
        ("team", "pod-b", "main"): {H100_A: 32 * 256},
        ("team", "pod-c", "main"): {MIG_1G: 9728},
    }


def test_each_process_counts_for_the_container_whose_grant_covers_its_gpu(nvml, demo_node):
    nvml.add_process(H100_A, 101, 3000)
    nvml.add_process(H100_A, 102, 1500, kind="compute+graphics")  # listed by both queries, counted once
    nvml.add_process(H100_A, 201, 6000)
    nvml.add_process(MIG_1G, 301, 9000)
    nvml.set_process_utilization(H100_A, 101, 30)
    nvml.set_process_utilization(H100_A, 102, 25)
    ids = {
        101: identity(101, UID_A, CID_A),
        102: identity(102, UID_A, CID_A),
        201: identity(201, UID_B, CID_B),
        301: identity(301, UID_C, CID_C),
    }
    snapshot = snapshot_of(nvml, demo_node, ids)
    a = use_of(snapshot, "pod-a", H100_A)
    assert (a.used_mib, a.granted_mib, a.utilization, a.pod_uid) == (4500, 4096, 55, UID_A)
    assert sorted(p.pid for p in a.processes) == [101, 102]
    b = use_of(snapshot, "pod-b", H100_A)
    assert (b.used_mib, b.granted_mib, b.utilization) == (6000, 8192, 0)  # no SM sample: idle
    c = use_of(snapshot, "pod-c", MIG_1G)
    assert (c.used_mib, c.granted_mib, c.mig, c.gpu, c.utilization) == (9000, 9728, True, A100, None)
    h100 = device_of(snapshot, H100_A)
    assert (h100.used_mib, h100.granted_mib, sum(h100.unknown_mib.values())) == (10500, 12288, 0)


def test_a_container_holding_a_grant_without_a_process_shows_zero_use(nvml, demo_node):
    snapshot = snapshot_of(nvml, demo_node, {})
    assert {(u.pod, u.used_mib, u.granted_mib) for u in snapshot.containers} == {
        ("pod-a", 0, 4096),
        ("pod-b", 0, 8192),
        ("pod-c", 0, 9728),
    }
    assert use_of(snapshot, "pod-a", H100_A).pod_uid == UID_A  # from the pod list


def test_memory_no_grant_covers_is_reported_per_gpu_with_the_reason(nvml, demo_node):
    nvml.set_memory_used(H100_B, 600)  # driver reservation: in NVML's figure, no process
    nvml.add_process(H100_B, 401, 1000)  # a host process
    nvml.add_process(H100_B, 402, 2000)  # a pod the API server does not list (gone)
    nvml.add_process(H100_B, 403, 4000)  # pod-a's sidecar: no grant at all
    nvml.add_process(H100_B, 404, 8000)  # pod-a's main, but its grant is on H100_A
    nvml.add_process(H100_B, 405, 16000)  # exited before /proc was read
    ids = {
        401: identity(401, None),
        402: identity(402, "deadbeef-dead-4eef-8eef-deadbeefdead", "5" * 64),
        403: identity(403, UID_A, CID_SIDECAR),
        404: identity(404, UID_A, CID_A),
        405: None,
    }
    snapshot = snapshot_of(nvml, demo_node, ids)
    b = device_of(snapshot, H100_B)
    assert b.unknown_mib == {"outside-pods": 1000, "unknown-pod": 2000, "no-grant": 12000, "exited": 16000}
    assert b.used_mib == 600 + 31000
    assert not [u for u in snapshot.containers if u.device == H100_B]
    assert snapshot.pressured(tolerance_mib=256) == {H100_B}  # 15000 MiB held that no grant covers


def test_a_container_started_after_the_pod_list_counts_as_an_unknown_pod_until_listed(nvml, demo_node):
    nvml.add_process(H100_A, 101, 1000)
    restarted = "6" * 64  # pod-a's main restarted: a new container ID the last list lacks
    snapshot = snapshot_of(nvml, demo_node, {101: identity(101, UID_A, restarted)})
    assert device_of(snapshot, H100_A).unknown_mib["unknown-pod"] == 1000


def test_a_static_pod_is_found_by_the_uid_in_its_mirror_annotation(demo_node, nvml):
    static_uid = "5d5e4a1a0b3b4a9e8c2c3a6d1f2e3b4c"
    mirror = podapi.PodInfo("0f0f0f0f-0f0f-4f0f-8f0f-0f0f0f0f0f0f", "kube-system", "pod-a", {CID_A: "main"}, static_uid)
    nvml.add_process(H100_A, 101, 1000)
    samples = gpu_usage.UsageReader(nvml, gpu_usage.shared_devices(demo_node)).read()
    grants = {("kube-system", "pod-a", "main"): {H100_A: 4096}}
    snapshot = attribution.attribute(samples, {101: identity(101, static_uid, CID_A)}, [mirror], grants)
    assert snapshot.containers[0].used_mib == 1000


def test_memory_nvml_cannot_report_makes_the_figure_a_lower_bound(nvml, demo_node):
    nvml.add_process(H100_A, 101, None)
    nvml.add_process(H100_A, 102, 700)
    snapshot = snapshot_of(nvml, demo_node, {101: identity(101, UID_A, CID_A), 102: identity(102, UID_A, CID_A)})
    a = use_of(snapshot, "pod-a", H100_A)
    assert (a.used_mib, a.used_complete) == (700, False)


def test_a_gpu_whose_process_query_fails_is_down_and_its_containers_left_out(nvml, demo_node):
    nvml.add_process(H100_A, 101, 5000)
    nvml.fail_process_queries(H100_A)
    snapshot = snapshot_of(nvml, demo_node, {101: identity(101, UID_A, CID_A)})
    a100 = device_of(snapshot, H100_A)
    assert not a100.ok and "NVMLError_Unknown" in a100.error
    assert a100.granted_mib == 12288  # the grants are still known
    assert not [u for u in snapshot.containers if u.device == H100_A]  # no figure rather than a wrong 0
    assert device_of(snapshot, H100_B).ok and use_of(snapshot, "pod-c", MIG_1G).used_mib == 0


def test_a_gpu_that_falls_off_the_bus_is_down_and_its_mig_devices_too(nvml, demo_node):
    nvml.fail_gpu(A100)
    nvml.fail_gpu(H100_B)
    snapshot = snapshot_of(nvml, demo_node, {})
    down = {d.uuid for d in snapshot.devices if not d.ok}
    assert down == {H100_B} | {m.uuid for m in demo_node.gpu(A100).mig}
    assert all("GpuIsLost" in d.error for d in snapshot.devices if not d.ok)
    assert {u.pod for u in snapshot.containers} == {"pod-a", "pod-b"}
    assert snapshot.pressured(0) == frozenset()
    nvml.recover_gpu(A100)
    assert use_of(snapshot_of(nvml, demo_node, {}), "pod-c", MIG_1G).used_mib == 0


def test_over_use_beyond_grants_puts_a_gpu_under_pressure_only_past_the_tolerance(nvml, demo_node):
    nvml.add_process(H100_A, 101, 4096 + 200)
    ids = {101: identity(101, UID_A, CID_A)}
    assert snapshot_of(nvml, demo_node, ids).pressured(tolerance_mib=256) == frozenset()
    nvml.add_process(H100_A, 101, 4096 + 300)
    assert snapshot_of(nvml, demo_node, ids).pressured(tolerance_mib=256) == {H100_A}
