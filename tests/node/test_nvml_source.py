"""NVML discovery (node/nvml_source.py) against the fake NVML, and on a real GPU."""

from __future__ import annotations

import dataclasses

import fake_nvml
import pytest

from gpuslice.node import inventory, nodefile, nvml_source


def started(node: inventory.NodeInventory) -> fake_nvml.FakeNvml:
    nvml = fake_nvml.FakeNvml(node)
    nvml.nvmlInit()
    return nvml


def test_discovery_finds_what_the_demo_node_file_describes(demo_node):
    found = nvml_source.discover(started(demo_node), read_sysfs=lambda path: None)
    assert found.gpus == demo_node.gpus
    assert found.source == "nvml"
    assert found.mig_profiles() == ("1g.10gb", "2g.20gb", "3g.40gb")


def test_discovery_of_eight_gpus_finds_every_nvlink_peer(h200_node):
    found = nvml_source.discover(started(h200_node), read_sysfs=lambda path: None)
    assert [dataclasses.replace(g, pci_bus_id="") for g in found.gpus] == list(h200_node.gpus)


def test_links_to_an_nvswitch_connect_every_switched_gpu(h200_node):
    nvml = started(h200_node)
    for gpu in nvml.gpus[:3]:
        gpu.links = ["00000000:E0:00.0"] * 18  # an NVSwitch, not a GPU
    for gpu in nvml.gpus[3:]:
        gpu.links = []
    found = nvml_source.discover(nvml, read_sysfs=lambda path: None)
    _, second, third = (g.uuid for g in found.gpus[:3])
    assert dict(found.gpus[0].nvlinks) == {second: 18, third: 18}
    assert found.nvlinks(second, third) == 18
    assert dict(found.gpus[4].nvlinks) == {}


@pytest.mark.parametrize(
    ("slices", "memory_mib", "parent_mib", "suffix", "name"),
    [
        ((1, 1), 9728, 81920, "", "1g.10gb"),  # A100 80GB
        ((2, 2), 19968, 81920, "", "2g.20gb"),
        ((3, 3), 40192, 81920, "", "3g.40gb"),
        ((4, 4), 40192, 81920, "", "4g.40gb"),
        ((7, 7), 80384, 81920, "", "7g.80gb"),
        ((1, 2), 19968, 81920, "", "1c.2g.20gb"),
        ((1, 1), 9728, 81920, "+me", "1g.10gb+me"),
        ((1, 1), 4864, 40960, "", "1g.5gb"),  # A100 40GB
        ((1, 1), 9984, 81559, "", "1g.10gb"),  # H100 80GB
        ((1, 1), 16384, 143771, "", "1g.18gb"),  # H200 141GB
    ],
)
def test_mig_profile_names_are_derived_as_nvidia_names_them(slices, memory_mib, parent_mib, suffix, name):
    compute, gpu = slices
    assert nvml_source.mig_profile_name(gpu, compute, memory_mib, parent_mib << 20, suffix) == name


def test_special_gpu_instance_profiles_keep_their_suffix():
    node = nodefile.parse(
        {
            "gpus": [
                {
                    "uuid": "GPU-a",
                    "model": "NVIDIA A100-SXM4-80GB",
                    "memoryMiB": 81920,
                    "index": 0,
                    "mig": [
                        {"uuid": "MIG-1", "profile": "1g.10gb+me", "memoryMiB": 9728},
                        {"uuid": "MIG-2", "profile": "1c.3g.40gb", "memoryMiB": 40192},
                    ],
                }
            ]
        }
    )
    found = nvml_source.discover(started(node), read_sysfs=lambda path: None)
    assert [(m.uuid, m.profile) for m in found.mig_devices()] == [("MIG-1", "1g.10gb+me"), ("MIG-2", "1c.3g.40gb")]


@pytest.mark.parametrize(("sysfs", "numa"), [("1\n", 1), ("-1\n", None), (None, None), ("junk", None)])
def test_numa_node_falls_back_to_sysfs_when_nvml_does_not_know(sysfs, numa):
    node = nodefile.parse(
        {"gpus": [{"uuid": "GPU-a", "model": "X", "memoryMiB": 1024, "index": 0, "pciBusId": "00000000:3B:00.0"}]}
    )
    paths = []
    found = nvml_source.discover(started(node), read_sysfs=lambda path: paths.append(path) or sysfs)
    assert found.gpus[0].numa_node == numa
    assert paths == ["/sys/bus/pci/devices/0000:3b:00.0/numa_node"]


def test_read_usage_reports_memory_and_utilisation(demo_node):
    nvml = started(demo_node)
    gpu = demo_node.gpus[0].uuid
    nvml.set_memory_used(gpu, 20_000)
    nvml.set_utilization(gpu, 37)
    assert nvml_source.read_usage(nvml, gpu) == (20_000, 81559, 37)
    mig = demo_node.gpus[2].mig[0]
    assert nvml_source.read_usage(nvml, mig.uuid) == (0, mig.memory_mib, None)


def test_the_fake_and_real_pynvml_both_have_every_name_the_protocol_uses():
    pynvml = pytest.importorskip("pynvml")
    names = {n for n in dir(nvml_source.Nvml) if n.startswith(("nvml", "NVML"))}
    names |= set(nvml_source.Nvml.__annotations__)
    assert len(names) > 30
    assert sorted(n for n in names if not hasattr(pynvml, n)) == []
    assert sorted(n for n in names if not hasattr(fake_nvml.FakeNvml, n)) == []


@pytest.mark.gpu
def test_real_discovery_on_this_machines_gpus():
    try:
        nvml = nvml_source.load_pynvml()
    except nvml_source.NvmlUnavailable as exc:
        pytest.skip(f"no NVIDIA driver/GPU here: {exc}")
    try:
        node = nvml_source.discover(nvml)
        print(nodefile.dump(node))
        assert node.gpus, "NVML initialised but reported no GPU"
        for gpu in node.gpus:
            assert gpu.uuid.startswith("GPU-") and gpu.memory_mib > 1024
            used, total, _ = nvml_source.read_usage(nvml, gpu.uuid)
            assert total == gpu.memory_mib and 0 <= used <= total
            for mig in gpu.mig:
                assert mig.uuid.startswith("MIG-") and nodefile._PROFILE_RE.match(mig.profile)
        assert nodefile.parse(__import__("yaml").safe_load(nodefile.dump(node))).gpus == node.gpus
    finally:
        nvml.nvmlShutdown()
