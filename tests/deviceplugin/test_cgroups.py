"""A process's pod and container from its cgroup file, in every layout kubelet produces with
containerd and CRI-O (cgroup v1 and v2, systemd and cgroupfs drivers), and the identity of a
process read from a fake /proc tree: gone processes and reused PIDs."""

from __future__ import annotations

import pytest
from fake_proc import LAYOUTS, FakeProc, cgroup_file, container_path, stat_line

from gpuslice.deviceplugin import cgroups

POD_UID = "1a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d"
CONTAINER_ID = "ab" * 32
SYSTEMD_UID = POD_UID.replace("-", "_")
STATIC_UID = "5d5e4a1a0b3b4a9e8c2c3a6d1f2e3b4c"  # a static pod's manifest hash


@pytest.mark.parametrize("qos", ["burstable", "besteffort", "guaranteed"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=["-".join(layout) for layout in LAYOUTS])
def test_every_kubelet_layout_names_the_pod_uid_and_the_container_id(layout, qos):
    version, runtime, driver = layout
    text = cgroup_file(version, container_path(runtime, driver, POD_UID, CONTAINER_ID, qos))
    found = cgroups.parse(text)
    assert found is not None
    assert (found.pod_uid, found.container_id) == (POD_UID, CONTAINER_ID)
    # CRI-O prefixes its IDs under both drivers; containerd's cgroupfs IDs are bare
    assert found.runtime == ("cri-o" if runtime == "cri-o" else "containerd" if driver == "systemd" else "")


@pytest.mark.parametrize(
    "path",
    [
        # read from inside the plugin's own cgroup namespace (cgroup v2, containerd's default)
        f"/../../kubepods-besteffort.slice/kubepods-besteffort-pod{SYSTEMD_UID}.slice"
        f"/cri-containerd-{CONTAINER_ID}.scope",
        f"/../../pod{POD_UID}/{CONTAINER_ID}",
        # a container running its own cgroup tree below its scope
        f"/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/crio-{CONTAINER_ID}.scope/container",
        # cri-dockerd
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice"
        f"/docker-{CONTAINER_ID}.scope",
    ],
    ids=["other-cgroup-namespace-systemd", "other-cgroup-namespace-cgroupfs", "nested-cgroup", "cri-dockerd"],
)
def test_paths_seen_from_another_cgroup_namespace_or_nested_still_name_the_container(path):
    found = cgroups.parse(f"0::{path}\n")
    assert found is not None and (found.pod_uid, found.container_id) == (POD_UID, CONTAINER_ID)


def test_a_static_pod_is_named_by_its_manifest_hash():
    found = cgroups.parse(f"0::/kubepods/besteffort/pod{STATIC_UID}/{CONTAINER_ID}\n")
    assert found == cgroups.ContainerRef(STATIC_UID, CONTAINER_ID, "")


@pytest.mark.parametrize(
    "text",
    [
        "0::/system.slice/containerd.service\n",  # a host daemon
        "0::/user.slice/user-1000.slice/session-3.scope\n",  # a login session
        "0::/\n",
        "12:memory:/docker/" + CONTAINER_ID + "\n0::/\n",  # a container outside Kubernetes
        "garbage\n",
        "",
    ],
)
def test_processes_outside_kubelets_pods_belong_to_no_pod(text):
    assert cgroups.parse(text) is None


def test_a_crio_conmon_belongs_to_the_pod_but_to_no_container():
    pod = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice"
    path = f"{pod}/crio-conmon-{CONTAINER_ID}.scope"
    assert cgroups.parse(f"0::{path}\n") == cgroups.ContainerRef(POD_UID, "")


def test_a_v1_file_prefers_a_hierarchy_that_names_the_container():
    text = (
        f"12:memory:/kubepods/burstable/pod{POD_UID}\n"  # pod level only
        f"11:pids:/kubepods/burstable/pod{POD_UID}/{CONTAINER_ID}\n"
        "0::/\n"
    )
    assert cgroups.parse(text) == cgroups.ContainerRef(POD_UID, CONTAINER_ID, "")


def test_start_time_is_read_after_a_command_name_with_spaces_and_parentheses():
    assert cgroups.start_ticks(stat_line(42, 987654, comm="evil) (name")) == 987654


def test_identity_of_a_process_in_a_fake_proc_tree(tmp_path):
    proc = FakeProc(tmp_path / "proc")
    ticks = proc.add_container_process(4242, POD_UID, CONTAINER_ID, layout=("v1", "cri-o", "cgroupfs"))
    identity = cgroups.read(4242, proc.path)
    assert identity == cgroups.Identity(4242, ticks, cgroups.ContainerRef(POD_UID, CONTAINER_ID, "cri-o"))


def test_a_process_that_is_gone_has_no_identity(tmp_path):
    proc = FakeProc(tmp_path / "proc")
    assert cgroups.read(4242, proc.path) is None
    proc.add_container_process(4242, POD_UID, CONTAINER_ID)
    proc.remove(4242)
    assert cgroups.read(4242, proc.path) is None


def test_a_pid_reused_after_nvml_answered_is_not_taken_for_the_process_nvml_listed(tmp_path):
    proc = FakeProc(tmp_path / "proc", uptime=5000.0)
    asked_at = cgroups.uptime_seconds(proc.path)
    assert asked_at == 5000.0
    # NVML listed PID 4242; it exited and a new process (another pod) got the PID a second later.
    proc.add_container_process(4242, "99999999-9999-4999-9999-999999999999", "cd" * 32, started=5001.0)
    assert cgroups.read(4242, proc.path, started_by=asked_at) is None
    # The same PID with a start time before the question is the listed process.
    proc.add_container_process(4242, POD_UID, CONTAINER_ID, started=4000.0)
    assert cgroups.read(4242, proc.path, started_by=asked_at).container.pod_uid == POD_UID


def test_the_real_proc_names_this_test_process(tmp_path):
    identity = cgroups.read(__import__("os").getpid())
    assert identity is not None and identity.start_ticks > 0
