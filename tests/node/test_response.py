"""What a container is given for its share (node/response.py): devices, CDI names, environment and
mounts under each deviceListStrategy and with MPS, and the fraction written short."""

from __future__ import annotations

import pytest

from gpuslice import config
from gpuslice.node import allocation, response

H100_A = "GPU-21302f2a-76fb-5940-b684-dae50f92c162"


SHARE = allocation.MemoryGrant(gpu_uuids=(H100_A,), units=159, memory_mib=159 * 256, fraction=0.5)


@pytest.mark.parametrize(
    ("overrides", "envs", "cdi", "mounts"),
    [
        (
            {},
            {
                "NVIDIA_VISIBLE_DEVICES": H100_A,
                "GPUSLICE_MEMORY_LIMIT_MIB": "40704",
                "GPUSLICE_GPU_FRACTION": "0.5",
                "GPUSLICE_GPU_COUNT": "1",
                "GPU_PORTION": "0.5",
            },
            [],
            [],
        ),
        (
            {"deviceListStrategy": "cdi-cri"},
            {
                "GPUSLICE_MEMORY_LIMIT_MIB": "40704",
                "GPUSLICE_GPU_FRACTION": "0.5",
                "GPUSLICE_GPU_COUNT": "1",
                "GPU_PORTION": "0.5",
            },
            [f"nvidia.com/gpu={H100_A}"],
            [],
        ),
        (
            {"mps.enabled": True, "mps.pipeDirectory": "/run/gpuslice/mps", "mps.containerPipeDirectory": "/mps"},
            {
                "NVIDIA_VISIBLE_DEVICES": H100_A,
                "GPUSLICE_MEMORY_LIMIT_MIB": "40704",
                "GPUSLICE_GPU_FRACTION": "0.5",
                "GPUSLICE_GPU_COUNT": "1",
                "GPU_PORTION": "0.5",
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=40704M",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
                "CUDA_MPS_PIPE_DIRECTORY": "/mps",
            },
            [],
            [("/mps", "/run/gpuslice/mps", False), ("/dev/shm", "/run/nvidia/mps/shm", False)],
        ),
    ],
    ids=["envvar", "cdi-cri", "mps"],
)
def test_the_container_environment_follows_the_strategy(overrides, envs, cdi, mounts):
    settings = config.load(environ={}, overrides=overrides)
    answer = response.memory_response(SHARE, settings)
    assert dict(answer.envs) == envs
    assert [d.name for d in answer.cdi_devices] == cdi
    assert [(m.container_path, m.host_path, m.read_only) for m in answer.mounts] == mounts


@pytest.mark.parametrize(
    ("fraction", "text"), [(0.5, "0.5"), (1.0, "1"), (1 / 3, "0.3333"), (0.99999, "0.9999"), (0.00001, "0")]
)
def test_fractions_are_short_and_never_more_than_granted(fraction, text):
    assert response.format_fraction(fraction) == text
