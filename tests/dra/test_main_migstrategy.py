"""migStrategy in DRA mode: the DRA plugin publishes and prepares the node as the device plugin
serves it (none leaves GPUs in MIG mode out, single shares each MIG device by memory, mixed
publishes MIG devices whole), and refuses a layout `single` cannot serve in one line."""

from __future__ import annotations

import json

import chartkit
import dra_kit
import pytest
import yaml
from dra_kit import claim, dirs_fixture, ref, result, uid  # noqa: F401 - fixture

from gpuslice import config, contract
from gpuslice.dra import checkpoint, main, preparer, slices
from gpuslice.node import nodefile, startup

pytestmark = pytest.mark.usefixtures("no_leftover_tasks")

DEMO = chartkit.REPO / "gpuslice" / "examples" / "demo-node.yaml"
PROFILE_MIB = 40192


def a100_node_file(tmp_path, profiles_per_gpu=(("3g.40gb", "3g.40gb"), ("3g.40gb", "3g.40gb"))):
    """Two A100s in MIG mode, each with the MIG devices named (uniform by default)."""
    memory = {"3g.40gb": PROFILE_MIB, "1g.10gb": 9728}
    gpus = [
        {
            "uuid": f"GPU-{index:08d}-0000-0000-0000-000000000000",
            "model": "NVIDIA A100-SXM4-80GB",
            "memoryMiB": 81920,
            "index": index,
            "mig": [
                {"uuid": f"MIG-{index:04d}{j:04d}-0000-0000-0000-000000000000", "profile": p, "memoryMiB": memory[p]}
                for j, p in enumerate(profiles)
            ],
        }
        for index, profiles in enumerate(profiles_per_gpu)
    ]
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump({"gpus": gpus}))
    return path


def printed(capsys, node_file, strategy: str) -> dict[str, dict]:
    argv = ["--node-file", str(node_file), "--print-resource-slices", "--node-name", "n", "--mig-strategy", strategy]
    assert main.main(argv) == 0, capsys.readouterr().err
    objs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert all(chartkit.schema_errors(o, "1.37.0") == [] and slices.check_slice(o) == [] for o in objs)
    return {d["name"]: d for o in objs for d in o["spec"]["devices"]}


def test_mixed_publishes_mig_devices_whole_and_none_leaves_their_gpu_out(capsys):
    mixed = printed(capsys, DEMO, "mixed")
    assert sorted(mixed) == ["gpu-0", "gpu-1", "gpu-2-mig-0", "gpu-2-mig-1", "gpu-2-mig-2", "gpu-2-mig-3"]
    none = printed(capsys, DEMO, "none")
    assert sorted(none) == ["gpu-0", "gpu-1"]
    assert none["gpu-1"] == mixed["gpu-1"]


def test_single_shares_each_mig_device_by_memory_with_its_gpu_as_parent(tmp_path, capsys):
    devices = printed(capsys, a100_node_file(tmp_path), "single")
    assert sorted(devices) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    third = devices["gpu-2"]  # the first MIG device of the second GPU
    assert third["allowMultipleAllocations"] is True
    assert third["attributes"]["type"] == {"string": "gpu"}
    assert third["attributes"]["uuid"] == {"string": "MIG-00010000-0000-0000-0000-000000000000"}
    assert third["attributes"]["parentUUID"] == {"string": "GPU-00000001-0000-0000-0000-000000000000"}
    units = PROFILE_MIB // 256
    assert third["capacity"]["memory"] == {
        "value": f"{PROFILE_MIB}Mi",
        "requestPolicy": {
            "default": f"{units * 256}Mi",
            "validRange": {"min": "256Mi", "max": f"{units * 256}Mi", "step": "256Mi"},
        },
    }


def test_under_single_a_failed_gpu_taints_every_mig_device_shared_on_it(tmp_path):
    settings = config.Config(mig_strategy="single")
    served = startup.served_node(nodefile.load(a100_node_file(tmp_path)), settings)
    taints = {"GPU-00000000-0000-0000-0000-000000000000": slices.Taint("xid-79", "2026-11-25T10:00:00Z")}
    devices = {d["name"]: d for d in slices.devices(served, settings.contract, taints)}
    assert [name for name, d in sorted(devices.items()) if "taints" in d] == ["gpu-0", "gpu-1"]


@pytest.mark.parametrize(
    ("profiles", "named"),
    [
        ((("3g.40gb", "3g.40gb"), ("3g.40gb", "1g.10gb")), "1g.10gb (9728 MiB), 3g.40gb (40192 MiB)"),
        ((("3g.40gb",), ()), "GPU-00000001"),
    ],
)
def test_single_on_a_node_not_laid_out_for_it_exits_2_in_one_line(tmp_path, capsys, profiles, named):
    node_file = a100_node_file(tmp_path, profiles)
    argv = ["--node-file", str(node_file), "--print-resource-slices", "--node-name", "n", "--mig-strategy", "single"]
    assert main.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuslice-dra-plugin: migStrategy single needs") and named in err
    assert err.count("\n") == 1


def test_single_with_mps_is_refused_as_the_device_plugin_refuses_it(tmp_path, capsys):
    argv = ["--node-file", str(a100_node_file(tmp_path)), "--print-resource-slices", "--mig-strategy", "single"]
    assert main.main([*argv, "--mps-enabled", "true"]) == 2
    assert "mps.enabled cannot be used with migStrategy single" in capsys.readouterr().err


async def test_under_single_a_share_is_prepared_on_its_mig_device(tmp_path, dirs):
    settings = config.Config(mig_strategy="single")
    served = startup.served_node(nodefile.load(a100_node_file(tmp_path)), settings)
    api = dra_kit.FakeApi()
    share = claim(uid(1), [result("gpu", "gpu-3", "10Gi", share_id="11111111-2222-4333-8444-555555555555")])
    api.add_claim(share)
    plugin = preparer.Preparer(
        node=served,
        settings=settings,
        pool="node-a",
        api=api,
        state=checkpoint.Checkpoint(dirs["state"] / "checkpoint.json", contract.Contract().dra_driver),
        cdi_dir=dirs["cdi"],
    )
    plugin.recover()
    assert (await plugin.prepare([ref(share)]))[uid(1)].error == ""
    spec = json.loads((dirs["cdi"] / f"k8s.gpu.gpuslice.io-claim_{uid(1)}.json").read_text())
    env = dict(entry.split("=", 1) for entry in spec["devices"][0]["containerEdits"]["env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "MIG-00010001-0000-0000-0000-000000000000"
    assert env["GPUSLICE_MEMORY_LIMIT_MIB"] == "10240"
    assert env["GPUSLICE_GPU_FRACTION"] == "0.2547"  # 40 of the MIG device's 157 units
