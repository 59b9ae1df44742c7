"""The ResourceSlices of DRA mode (dra/slices.py): structure (the 1.37 OpenAPI schema, strict), the
API's limits, the memory capacity and its request policy, MIG devices (shared by memory under
migStrategy single), NVLink and NUMA attributes, and taints. `gpuslice-dra-plugin
--print-resource-slices`: tests/dra/test_main.py."""

from __future__ import annotations

import dataclasses

import celpy
import chartkit
import pytest
from dra_kit import a100_node_file, by_name

from gpuslice import config, contract
from gpuslice.dra import slices
from gpuslice.node import inventory, nodefile, startup

KUBE = "1.37.0"
CONTRACT = contract.Contract()


@pytest.mark.parametrize("kube", ["1.34.0", "1.35.0", "1.36.0", "1.37.0"])
def test_demo_node_slices_follow_the_strict_resource_v1_schema_and_the_api_limits(demo_node, kube):
    taints = {demo_node.gpus[1].uuid: slices.Taint("xid-79", "2026-11-01T10:00:00Z")}
    objs = slices.build_slices(demo_node, CONTRACT, "node-a", owner={"name": "node-a", "uid": "u-1"}, taints=taints)
    assert len(objs) == 1
    for obj in objs:
        assert chartkit.schema_errors(obj, kube) == []
        assert slices.check_slice(obj) == []
    spec = objs[0]["spec"]
    assert spec["driver"] == "gpu.gpuslice.io" and spec["nodeName"] == "node-a"
    assert spec["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 1}
    assert objs[0]["metadata"]["ownerReferences"][0] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "node-a",
        "uid": "u-1",
        "controller": True,
    }


def test_every_gpu_is_one_shared_device_whose_memory_steps_by_the_unit(demo_node):
    devices = by_name(slices.build_slices(demo_node, CONTRACT, "node-a"))
    gpu = devices["gpu-0"]
    assert gpu["allowMultipleAllocations"] is True
    # 81559 MiB hold 318 whole units of 256 MiB: a request without capacity takes all of them. The
    # capacity is named in the driver's domain: no other device (MIG, another driver's) has it.
    # Beside it two tags of 1 that a share takes none of (default 0): a whole-GPU request picks a
    # GPU, or a GPU of 81559 MiB, by asking one, with no CEL selector.
    tag = {"value": "1", "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "1"}}}
    assert gpu["capacity"] == {
        "gpu.gpuslice.io/memory": {
            "value": "81559Mi",
            "requestPolicy": {"default": "81408Mi", "validRange": {"min": "256Mi", "max": "81408Mi", "step": "256Mi"}},
        },
        "gpu.gpuslice.io/whole": tag,
        "gpu.gpuslice.io/m81559": tag,
    }
    assert CONTRACT.dra_tag_memory(81559) == "gpu.gpuslice.io/m81559"
    assert gpu["attributes"]["type"] == {"string": "gpu"}
    assert gpu["attributes"]["memoryMiB"] == {"int": 81559}
    assert gpu["attributes"]["product"] == {"string": "NVIDIA-H100-80GB-HBM3"}
    assert gpu["attributes"]["numaNode"] == {"int": 0}
    assert "taints" not in gpu


def test_mig_devices_are_whole_devices_with_their_profile_and_parent(demo_node):
    devices = by_name(slices.build_slices(demo_node, CONTRACT, "node-a"))
    assert sorted(devices) == ["gpu-0", "gpu-1", "gpu-2-mig-0", "gpu-2-mig-1", "gpu-2-mig-2", "gpu-2-mig-3"]
    mig = devices["gpu-2-mig-0"]
    assert "allowMultipleAllocations" not in mig
    assert mig["capacity"] == {"memory": {"value": "40192Mi"}}  # not the shares' capacity: taken whole
    assert mig["attributes"]["migProfile"] == {"string": "3g.40gb"}
    assert mig["attributes"]["parentUUID"] == {"string": "GPU-7a6a7324-0d4c-5ca7-b8a7-1220b7b466f9"}
    assert mig["attributes"]["type"] == {"string": "mig"}


def test_nvlink_connected_gpus_share_a_domain_and_count_their_peers(demo_node, h200_node):
    demo = by_name(slices.build_slices(demo_node, CONTRACT, "a"))
    assert (
        demo["gpu-0"]["attributes"]["nvlinkDomain"]
        == demo["gpu-1"]["attributes"]["nvlinkDomain"]
        == {"string": "nvl-0"}
    )
    assert demo["gpu-0"]["attributes"]["nvlinkPeers"] == {"int": 1}
    h200 = by_name(slices.build_slices(h200_node, CONTRACT, "b"))
    assert {d["attributes"]["nvlinkDomain"]["string"] for d in h200.values()} == {"nvl-0"}
    assert {d["attributes"]["nvlinkPeers"]["int"] for d in h200.values()} == {7}
    lonely = inventory.NodeInventory(
        gpus=(
            inventory.Gpu(uuid="GPU-a", model="L4", memory_mib=23034, index=0),
            inventory.Gpu(uuid="GPU-b", model="L4", memory_mib=23034, index=1),
        )
    )
    pcie = by_name(slices.build_slices(lonely, CONTRACT, "c"))
    assert pcie["gpu-0"]["attributes"]["nvlinkDomain"] != pcie["gpu-1"]["attributes"]["nvlinkDomain"]


def test_an_unhealthy_gpu_is_tainted_with_its_mig_devices_and_the_node_marker_taints_all(demo_node):
    a100 = demo_node.gpus[2].uuid
    taint = slices.Taint("XID 79: GPU fell off the bus", "2026-11-01T10:00:00Z")
    devices = by_name(slices.build_slices(demo_node, CONTRACT, "node-a", taints={a100: taint}))
    tainted = sorted(name for name, d in devices.items() if d.get("taints"))
    assert tainted == ["gpu-2-mig-0", "gpu-2-mig-1", "gpu-2-mig-2", "gpu-2-mig-3"]
    assert devices["gpu-2-mig-1"]["taints"] == [
        {
            "key": "gpu.gpuslice.io/unhealthy",
            "value": "XID-79-GPU-fell-off-the-bus",
            "effect": "NoSchedule",
            "timeAdded": "2026-11-01T10:00:00Z",
        }
    ]
    everything = by_name(slices.build_slices(demo_node, CONTRACT, "node-a", taints={"*": taint}))
    assert all(d.get("taints") for d in everything.values())
    obj = slices.build_slices(demo_node, CONTRACT, "node-a", taints={"*": taint})[0]
    assert chartkit.schema_errors(obj, KUBE) == []


def _big_node(gpus: int, migs_per_gpu: int) -> inventory.NodeInventory:
    return inventory.NodeInventory(
        gpus=tuple(
            inventory.Gpu(
                uuid=f"GPU-{i:04d}",
                model="NVIDIA A100-SXM4-80GB",
                memory_mib=81920,
                index=i,
                mig_enabled=True,
                mig=tuple(
                    inventory.MigDevice(
                        uuid=f"MIG-{i:04d}-{j}", profile="1g.10gb", memory_mib=9728, parent_uuid=f"GPU-{i:04d}"
                    )
                    for j in range(migs_per_gpu)
                ),
            )
            for i in range(gpus)
        )
    )


def test_more_than_64_devices_are_split_into_slices_of_one_pool():
    objs = slices.build_slices(_big_node(10, 7), CONTRACT, "big")
    assert [len(o["spec"]["devices"]) for o in objs] == [64, 6]
    assert {o["spec"]["pool"]["resourceSliceCount"] for o in objs} == {2}
    assert len({o["metadata"]["name"] for o in objs}) == 2
    names = [d["name"] for o in objs for d in o["spec"]["devices"]]
    assert len(names) == len(set(names)) == 70
    assert all(chartkit.schema_errors(o, KUBE) == [] for o in objs)


def test_a_node_without_gpus_still_publishes_its_pool():
    objs = slices.build_slices(inventory.NodeInventory(gpus=()), CONTRACT, "empty")
    assert len(objs) == 1 and objs[0]["spec"]["devices"] == []
    assert chartkit.schema_errors(objs[0], KUBE) == []


def test_the_unit_size_and_prefix_shape_the_driver_and_the_policy(demo_node):
    custom = contract.Contract(prefix="gpu.example.com", unit_mib=512)
    objs = slices.build_slices(demo_node, custom, "node-a")
    assert objs[0]["spec"]["driver"] == "gpu.gpu.example.com"
    policy = by_name(objs)["gpu-0"]["capacity"]["gpu.gpu.example.com/memory"]["requestPolicy"]
    assert policy == {"default": "81408Mi", "validRange": {"min": "512Mi", "max": "81408Mi", "step": "512Mi"}}


def test_a_gpu_of_one_unit_gets_a_policy_without_step_and_a_smaller_one_no_device():
    node = inventory.NodeInventory(
        gpus=(
            inventory.Gpu(uuid="GPU-one", model="tiny", memory_mib=300, index=0),
            inventory.Gpu(uuid="GPU-none", model="tinier", memory_mib=200, index=1),
        )
    )
    objs = slices.build_slices(node, CONTRACT, "n")
    devices = by_name(objs)
    assert list(devices) == ["gpu-0"]
    assert devices["gpu-0"]["capacity"][CONTRACT.dra_capacity_memory]["requestPolicy"] == {
        "default": "256Mi",
        "validRange": {"min": "256Mi", "max": "256Mi"},
    }
    assert slices.check_slice(objs[0]) == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda s: s["spec"]["devices"].extend([dict(s["spec"]["devices"][0], name=f"x-{i}") for i in range(130)]),
            "limit is 128",
        ),
        (lambda s: s["spec"]["devices"][0].update(name="GPU_0"), "is not a DNS label"),
        (lambda s: s["spec"]["devices"][1].update(name="gpu-0"), "used twice"),
        (lambda s: s["spec"]["devices"][0]["attributes"].update(productName={"string": "x" * 65}), "longer than 64"),
        (lambda s: s["spec"]["devices"][0]["attributes"].update({"bad-name": {"int": 1}}), "C identifier"),
        (
            lambda s: s["spec"]["devices"][0]["attributes"].update({f"a{i}": {"int": i} for i in range(30)}),
            "the limit is 32",
        ),
        (
            lambda s: s["spec"]["devices"][0]["capacity"][CONTRACT.dra_capacity_memory]["requestPolicy"].update(
                default="1000Mi"
            ),
            "multiple of step",
        ),
        (
            lambda s: s["spec"]["devices"][0]["capacity"][CONTRACT.dra_capacity_memory]["requestPolicy"][
                "validRange"
            ].update(max="90000Mi"),
            "larger than the capacity",
        ),
        (lambda s: s["spec"]["devices"][0].pop("allowMultipleAllocations"), "needs allowMultipleAllocations"),
        (
            lambda s: s["spec"]["devices"][0]["capacity"][CONTRACT.dra_tag_whole]["requestPolicy"].update(default="2"),
            "default and min must be at most validRange.max 1",
        ),
        (
            lambda s: s["spec"]["devices"][0]["capacity"][CONTRACT.dra_tag_whole].update(value="0.5"),
            "quantities must be whole numbers",
        ),
        (
            lambda s: s["spec"]["devices"][0].update(taints=[{"key": "k", "value": "v", "effect": "PreferNoSchedule"}]),
            "taint effect",
        ),
        (lambda s: s["spec"].update(driver="Not_A_Driver"), "spec.driver"),
    ],
    ids=[
        "too-many-devices",
        "device-name",
        "duplicate-device",
        "long-attribute",
        "attribute-name",
        "too-many-attributes",
        "default-off-step",
        "max-over-capacity",
        "policy-without-sharing",
        "tag-default-over-max",
        "tag-not-a-whole-number",
        "taint-effect",
        "driver-name",
    ],
)
def test_check_slice_names_what_the_api_server_would_refuse(demo_node, change, message):
    obj = slices.build_slices(demo_node, CONTRACT, "node-a")[0]
    change(obj)
    problems = slices.check_slice(obj)
    assert any(message in p for p in problems), problems


def test_tainted_slices_hold_at_most_64_devices(demo_node):
    obj = slices.build_slices(demo_node, CONTRACT, "node-a", taints={"*": slices.Taint("x", "2026-01-01T00:00:00Z")})[0]
    obj["spec"]["devices"] = [dict(obj["spec"]["devices"][0], name=f"d-{i}") for i in range(65)]
    assert any("limit is 64" in p for p in slices.check_slice(obj))


def test_build_refuses_a_node_name_the_api_would_refuse(demo_node):
    with pytest.raises(slices.SliceError, match="metadata.name"):
        slices.build_slices(demo_node, CONTRACT, "Node_A")


def test_comparison_ignores_the_generation_and_taint_times(demo_node):
    taint = {demo_node.gpus[0].uuid: slices.Taint("xid-79", "2026-01-01T00:00:00Z")}
    later = {demo_node.gpus[0].uuid: slices.Taint("xid-79", "2026-02-01T00:00:00Z")}
    one = slices.build_slices(demo_node, CONTRACT, "n", generation=1, taints=taint)
    two = slices.build_slices(demo_node, CONTRACT, "n", generation=7, taints=later)
    assert slices.comparable(one) == slices.comparable(two)
    assert slices.comparable(one) != slices.comparable(slices.build_slices(demo_node, CONTRACT, "n"))


# --- CEL: the selectors of DRA mode pick the right devices --------------------------------------


def cel_select(expression: str, device: dict, driver: str = "gpu.gpuslice.io") -> bool:
    def value(attribute: dict):
        return next(iter(attribute.values()))

    environment = celpy.Environment()
    program = environment.program(environment.compile(expression))
    activation = {
        "device": celpy.json_to_cel(
            {"driver": driver, "attributes": {driver: {k: value(v) for k, v in device["attributes"].items()}}}
        )
    }
    return bool(program.evaluate(activation))


def test_device_attributes_answer_the_selectors_dra_mode_writes(demo_node):
    devices = by_name(slices.build_slices(demo_node, CONTRACT, "node-a"))
    shared = 'device.driver == "gpu.gpuslice.io" && device.attributes["gpu.gpuslice.io"].type == "gpu"'
    mig = (
        'device.attributes["gpu.gpuslice.io"].type == "mig" '
        '&& device.attributes["gpu.gpuslice.io"].migProfile == "1g.10gb"'
    )
    assert sorted(n for n, d in devices.items() if cel_select(shared, d)) == ["gpu-0", "gpu-1"]
    assert sorted(n for n, d in devices.items() if cel_select(mig, d)) == ["gpu-2-mig-2", "gpu-2-mig-3"]
    sized = 'device.attributes["gpu.gpuslice.io"].memoryMiB == 81559'
    assert sorted(n for n, d in devices.items() if cel_select(sized, d)) == ["gpu-0", "gpu-1"]


def test_device_names_stay_dns_labels_for_any_index():
    gpu = inventory.Gpu(uuid="GPU-x", model="m", memory_mib=1024, index=15)
    assert slices.device_name(gpu) == "gpu-15"
    assert slices.mig_device_name(dataclasses.replace(gpu, index=7), 6) == "gpu-7-mig-6"


def test_under_single_a_failed_gpu_taints_every_mig_device_shared_on_it(tmp_path):
    settings = config.Config(mig_strategy="single")
    served = startup.served_node(nodefile.load(a100_node_file(tmp_path)), settings)
    taints = {"GPU-00000000-0000-0000-0000-000000000000": slices.Taint("xid-79", "2026-11-25T10:00:00Z")}
    devices = {d["name"]: d for d in slices.devices(served, settings.contract, taints)}
    assert [name for name, d in sorted(devices.items()) if "taints" in d] == ["gpu-0", "gpu-1"]
