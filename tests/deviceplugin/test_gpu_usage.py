"""One NVML sample per shared device (deviceplugin/gpu_usage.py) from the fake NVML: process
queries a driver does not support are skipped, and MPS clients are listed with their own memory."""

from __future__ import annotations

import pytest
from fake_nvml import FakeNvml, NVMLError_NotSupported

from gpuslice.deviceplugin import gpu_usage

H100_A = "GPU-21302f2a-76fb-5940-b684-dae50f92c162"


@pytest.fixture
def nvml(demo_node) -> FakeNvml:
    fake = FakeNvml(demo_node)
    fake.nvmlInit()
    return fake


class DriverWithoutMpsQueries(FakeNvml):
    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle):
        raise NVMLError_NotSupported()


def test_optional_process_queries_that_are_not_supported_are_skipped(demo_node):
    nvml = DriverWithoutMpsQueries(demo_node)
    nvml.nvmlInit()
    nvml.add_process(H100_A, 101, 1234)
    reader = gpu_usage.UsageReader(nvml, ((H100_A, H100_A),))
    (sample,) = reader.read()
    assert sample.ok and sample.processes == (gpu_usage.GpuProcess(101, 1234),)


def test_mps_clients_are_listed_with_their_own_memory(nvml, demo_node):
    nvml.add_process(H100_A, 900, 300)  # the MPS server
    nvml.add_process(H100_A, 101, 2048, kind="mps")
    (sample,) = gpu_usage.UsageReader(nvml, ((H100_A, H100_A),)).read()
    assert sample.processes == (gpu_usage.GpuProcess(101, 2048), gpu_usage.GpuProcess(900, 300))
