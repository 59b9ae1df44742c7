"""The node labels' values, written and read in one place (gpuslice/labelcodec.py): what the plugin
writes reads back unchanged, and anything else is refused naming the label."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslice import contract, labelcodec
from gpuslice.node import inventory, labels

CONTRACT = contract.Contract()


@pytest.mark.parametrize("count", [0, 1, 42, 81559, 10**12 - 1])
def test_a_count_is_written_in_plain_digits(count: int) -> None:
    assert labelcodec.count_value(count) == str(count)


@pytest.mark.parametrize("count", [-1, -81559, 10**12])
def test_a_count_no_reader_would_take_is_not_written(count: int) -> None:
    with pytest.raises(ValueError, match="cannot be published as a count label"):
        labelcodec.count_value(count)


@given(count=st.integers(0, 10**12 - 1))
def test_every_count_written_reads_back(count: int) -> None:
    assert labelcodec.count_of("k", labelcodec.count_value(count)) == count


@pytest.mark.parametrize(
    "value",
    ["", "-3", "+3", "1.5", "1e3", "1_0", " 12", "12 ", "１２", "٣", "0x1", "9" * 13, "twelve", None, 12, True],
)
def test_a_value_the_plugin_never_writes_is_refused_naming_the_label(value: Any) -> None:
    with pytest.raises(labelcodec.Malformed, match=r"label gpuslice.io/gpu.count=.* is not a whole number"):
        labelcodec.count_of(CONTRACT.label_gpu_count, value)


def test_a_long_value_is_quoted_cut_short() -> None:
    with pytest.raises(labelcodec.Malformed, match=r"\.\.\. \(300 characters\)"):
        labelcodec.count_of("k", "x" * 300)


def test_a_missing_label_reads_as_none_and_a_present_one_as_its_count() -> None:
    assert labelcodec.read_count({}, CONTRACT.label_free_gpus) is None
    assert labelcodec.read_count({CONTRACT.label_free_gpus: "3"}, CONTRACT.label_free_gpus) == 3
    with pytest.raises(labelcodec.Malformed):
        labelcodec.read_count({CONTRACT.label_free_gpus: "three"}, CONTRACT.label_free_gpus)


def test_mig_memory_reads_back_per_profile_in_resource_form() -> None:
    written = labelcodec.mig_memory_labels(CONTRACT, {"1g.10gb": 9728, "1g.10gb+me": 9728, "3g.40gb": 40192})
    assert written == {
        "gpuslice.io/mig.1g.10gb.memory-mib": "9728",
        "gpuslice.io/mig.1g.10gb.me.memory-mib": "9728",
        "gpuslice.io/mig.3g.40gb.memory-mib": "40192",
    }
    others = {"gpuslice.io/mig.1g.10gb.free": "7", "example.com/mig.2g.20gb.memory-mib": "20000"}
    assert labelcodec.mig_memory_of({**written, **others}, CONTRACT) == {
        "1g.10gb": 9728,
        "1g.10gb.me": 9728,
        "3g.40gb": 40192,
    }


def test_mig_memory_that_is_not_a_count_is_refused_even_without_a_profile() -> None:
    with pytest.raises(labelcodec.Malformed, match="mig.1g.10gb.memory-mib='lots'"):
        labelcodec.mig_memory_of({"gpuslice.io/mig.1g.10gb.memory-mib": "lots"}, CONTRACT)
    with pytest.raises(labelcodec.Malformed):
        labelcodec.mig_memory_of({"gpuslice.io/mig.memory-mib": "lots"}, CONTRACT)
    assert labelcodec.mig_memory_of({"gpuslice.io/mig.memory-mib": "5"}, CONTRACT) == {}


def _node() -> inventory.NodeInventory:
    mig = tuple(
        inventory.MigDevice(uuid=f"MIG-{i}", profile="1g.10gb+me", memory_mib=9728, parent_uuid="GPU-m")
        for i in range(3)
    )
    return inventory.NodeInventory(
        gpus=(
            inventory.Gpu(uuid="GPU-a", model="NVIDIA H100 80GB HBM3", memory_mib=81559, index=0),
            inventory.Gpu(uuid="GPU-b", model="NVIDIA H100 80GB HBM3", memory_mib=81559, index=1),
            inventory.Gpu(uuid="GPU-m", model="NVIDIA A100", memory_mib=40960, index=2, mig_enabled=True, mig=mig),
        )
    )


def test_every_label_the_plugin_publishes_but_the_product_reads_back_through_the_codec() -> None:
    published = labels.node_labels(
        _node(),
        CONTRACT,
        allocated={"GPU-a": 100},
        allocated_mig={"MIG-0"},
        placement_score=250,
        headroom=(-5, 4096),
        cpu_per_gpu_milli=4000,
    )
    counts = {k: v for k, v in published.items() if k != CONTRACT.label_gpu_product}
    assert len(counts) == len(published) - 1 > 10
    for key, value in counts.items():
        assert labelcodec.count_value(labelcodec.count_of(key, value)) == value
    assert labelcodec.mig_memory_of(published, CONTRACT) == {"1g.10gb.me": 9728}
