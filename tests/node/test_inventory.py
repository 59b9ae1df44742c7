"""A node's GPUs and MIG devices as one data model (node/inventory.py): the GPUs shared by memory,
the MIG profiles present, NVLinks between two GPUs, and duplicate UUIDs refused."""

from __future__ import annotations

import pytest

from gpuslice.node import inventory


def test_demo_node_has_two_shared_gpus_and_one_mig_gpu(demo_node):
    assert [g.model for g in demo_node.memory_gpus] == ["NVIDIA H100 80GB HBM3"] * 2
    a100 = demo_node.gpus[2]
    assert a100.mig_enabled and [m.profile for m in a100.mig] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert demo_node.mig_profiles() == ("1g.10gb", "2g.20gb", "3g.40gb")
    h0, h1 = demo_node.memory_gpus
    assert demo_node.nvlinks(h0.uuid, h1.uuid) == 18


def gpu(uuid: str, index: int, **fields) -> inventory.Gpu:
    return inventory.Gpu(uuid=uuid, model="NVIDIA H100 80GB HBM3", memory_mib=81559, index=index, **fields)


def test_nvlinks_between_two_gpus_are_the_larger_count_of_the_two_sides():
    node = inventory.NodeInventory(gpus=(gpu("GPU-a", 0, nvlinks={"GPU-b": 4}), gpu("GPU-b", 1, nvlinks={"GPU-a": 18})))
    assert node.nvlinks("GPU-a", "GPU-b") == node.nvlinks("GPU-b", "GPU-a") == 18
    lonely = inventory.NodeInventory(gpus=(gpu("GPU-a", 0), gpu("GPU-b", 1)))
    assert lonely.nvlinks("GPU-a", "GPU-b") == 0
    with pytest.raises(KeyError):
        lonely.gpu("GPU-z")


def test_a_uuid_given_twice_is_refused_naming_it_and_the_source():
    mig = inventory.MigDevice(uuid="GPU-a", profile="1g.10gb", memory_mib=9728, parent_uuid="GPU-b")
    in_mig_mode = gpu("GPU-b", 1, mig_enabled=True, mig=(mig,))
    with pytest.raises(ValueError, match="node.yaml: duplicate UUID GPU-a"):
        inventory.NodeInventory(gpus=(gpu("GPU-a", 0), in_mig_mode), source="node.yaml")
    with pytest.raises(ValueError, match="inventory: duplicate UUID GPU-a"):
        inventory.NodeInventory(gpus=(gpu("GPU-a", 0), gpu("GPU-a", 1)))


def test_gpus_in_mig_mode_are_not_shared_by_memory_and_their_mig_devices_are_listed_in_order():
    migs = tuple(
        inventory.MigDevice(uuid=f"MIG-{i}", profile=p, memory_mib=m, parent_uuid="GPU-b")
        for i, (p, m) in enumerate((("3g.40gb", 40192), ("1g.10gb", 9728), ("1g.10gb", 9728)))
    )
    node = inventory.NodeInventory(gpus=(gpu("GPU-a", 0), gpu("GPU-b", 1, mig_enabled=True, mig=migs)))
    assert [g.uuid for g in node.memory_gpus] == ["GPU-a"]
    assert [m.uuid for m in node.mig_devices()] == ["MIG-0", "MIG-1", "MIG-2"]
    assert node.mig_profiles() == ("1g.10gb", "3g.40gb")
