"""DRA mode of the replay on the real control plane (sim/kube_dra.py): a claim's grant read back from
its allocation, per device. The real allocator: tests/e2e/test_real_replay.py (DRA mode)."""

from __future__ import annotations

import pytest

from gpuslice import config
from gpuslice.sim import kube_dra, trace


def test_a_dra_claims_grant_is_recorded_per_device_in_mib() -> None:
    contract = config.Config().contract
    node = trace.node_inventory(trace.TraceNode("t4", 64000, 262144, 2, "T4"))
    ledger = kube_dra.DeviceLedger(contract)
    ledger.add_slices(kube_dra.node_slices(node, contract, "t4"))
    result = {
        "driver": contract.dra_driver,
        "pool": "t4",
        "device": "gpu-1",
        "consumedCapacity": {contract.dra_capacity_memory: "9216Mi"},
    }
    claim = {"status": {"allocation": {"devices": {"results": [result]}}}}
    pool, granted, shares = ledger.grant(claim)
    assert (pool, granted) == ("t4", pytest.approx(0.6))
    assert [s.to_json() for s in shares] == [
        {"uuid": "gpu-1", "units": 9216, "total_units": 15360, "unit_mib": 1, "gpu_memory_mib": 15360}
    ]
