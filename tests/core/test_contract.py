"""The resource contract: names, device IDs and label values other components rely on."""

import pytest

from gpuslice import contract


def test_default_resource_names_follow_the_prefix():
    c = contract.Contract()
    assert c.gpu_memory_resource == "gpuslice.io/gpu-memory"
    assert c.mig_resource("1g.10gb") == "gpuslice.io/mig-1g.10gb"
    assert c.mig_resource("1g.10gb+me") == "gpuslice.io/mig-1g.10gb.me"
    assert contract.Contract(prefix="example.com").gpu_memory_resource == "example.com/gpu-memory"


def test_unit_device_ids_round_trip_and_fit_kubelets_limit():
    uuid = "GPU-21302f2a-76fb-5940-b684-dae50f92c162"
    device_id = contract.unit_device_id(uuid, 560, 256)
    assert device_id == f"{uuid}::256Mi::560"
    assert contract.parse_unit_device_id(device_id) == (uuid, 256, 560)
    assert contract.parse_unit_device_id(device_id).unit_mib == 256
    # the largest size and index a node can have still fit kubelet's 63 characters
    assert len(contract.unit_device_id(uuid, 143_771, 65_536)) <= 63


def test_the_same_unit_at_another_unit_size_is_another_device():
    uuid = "GPU-21302f2a-76fb-5940-b684-dae50f92c162"
    assert contract.unit_device_id(uuid, 17, 256) != contract.unit_device_id(uuid, 17, 128)
    assert contract.Contract(unit_mib=128).unit_device_id(uuid, 17) == contract.unit_device_id(uuid, 17, 128)


@pytest.mark.parametrize(
    "bad", ["GPU-abc", "::3", "GPU-abc::x", "", "GPU-abc::17", "GPU-abc::256::17", "GPU-abc::xMi::17", "::256Mi::1"]
)
def test_malformed_unit_device_ids_are_named_in_the_error(bad):
    with pytest.raises(ValueError, match="not a gpuslice memory-unit device ID"):
        contract.parse_unit_device_id(bad)


@pytest.mark.parametrize(
    ("device_id", "gpu"),
    [("GPU-abc::256Mi::17", "GPU-abc"), ("GPU-abc::17", "GPU-abc"), ("MIG-abc", "")],
    ids=["current", "without-unit-size", "not-a-unit"],
)
def test_the_gpu_of_a_unit_is_read_in_either_id_format(device_id, gpu):
    assert contract.unit_gpu_uuid(device_id) == gpu


def test_overlong_device_ids_are_refused():
    with pytest.raises(ValueError, match="63"):
        contract.unit_device_id("GPU-" + "x" * 60, 1, 256)


def test_label_values_are_valid_kubernetes_label_values():
    assert contract.label_value("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert contract.label_value(" Tesla V100-SXM2-16GB ") == "Tesla-V100-SXM2-16GB"
    assert len(contract.label_value("x" * 100)) == 63


@pytest.mark.parametrize(("mib", "units"), [(2000, 8), (256, 1), (257, 2), (1, 1), (40960, 160)])
def test_units_round_up_so_a_pod_never_gets_less_than_it_asked(mib, units):
    assert contract.units_for_mib(mib, 256) == units
