"""What DRA mode's steering labels count as in use (dra/labeller.py, `in_use`): every prepared
share's memory rounded up to whole units on its GPU, MIG devices by UUID. The labeller inside the
plugin, publishing and withdrawing the labels: tests/dra/test_main.py."""

from __future__ import annotations

from dra_kit import H100, H100_B, MIG_3G

from gpuslice.dra import labeller, shares


def share(uuid: str, memory_mib: int, mig_profile: str | None = None, gpu_uuid: str = "") -> shares.Share:
    return shares.Share("gpu", "gpu-x", None, uuid, gpu_uuid or uuid, memory_mib, mig_profile)


def test_shares_count_whole_units_on_their_gpu_a_partial_unit_taken():
    units, mig = labeller.in_use([share(H100, 2048), share(H100, 300), share(H100_B, 256)], unit_mib=256)
    assert units == {H100: 8 + 2, H100_B: 1}
    assert mig == set()


def test_a_mig_device_counts_by_its_uuid_and_takes_no_units_of_its_gpu():
    units, mig = labeller.in_use([share(MIG_3G, 40192, "3g.40gb", gpu_uuid="GPU-parent")], unit_mib=256)
    assert mig == {MIG_3G}
    assert units == {}


def test_nothing_prepared_is_nothing_in_use():
    assert labeller.in_use([], unit_mib=256) == ({}, set())
