"""migStrategy in DRA mode, through `gpuslice-dra-plugin --print-resource-slices` (dra/main.py):
the DRA plugin publishes the node as the device plugin serves it (none leaves GPUs in MIG mode out,
single shares each MIG device by memory, mixed publishes MIG devices whole), and refuses a layout
`single` cannot serve in one line. A failed GPU's taints under single: tests/dra/test_slices.py; a
share prepared on its MIG device: tests/dra/test_preparer.py."""

from __future__ import annotations

import chartkit
import pytest
import yaml
from dra_kit import PROFILE_MIB, a100_node_file

from gpuslice.dra import main, slices

pytestmark = pytest.mark.usefixtures("no_leftover_tasks")

DEMO = chartkit.REPO / "gpuslice" / "examples" / "demo-node.yaml"


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
    assert third["capacity"]["gpu.gpuslice.io/memory"] == {  # shared by memory: the shares' capacity
        "value": f"{PROFILE_MIB}Mi",
        "requestPolicy": {
            "default": f"{units * 256}Mi",
            "validRange": {"min": "256Mi", "max": f"{units * 256}Mi", "step": "256Mi"},
        },
    }


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
