"""The usage monitor on a real GPU (marked `gpu`: skipped without an NVIDIA driver, or without
PyTorch to allocate with). Starts a small CUDA process holding a known amount of memory, then
runs discovery and the monitor's NVML reader, /proc reader and attribution on it, and prints what
was measured (`pytest -m gpu -s tests/deviceplugin/test_monitor_gpu.py`; record the figures in
docs/isolation.md). Changes no GPU setting: it only allocates memory in a child process."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gpuslice.deviceplugin import attribution, cgroups, gpu_usage, overuse, podapi
from gpuslice.node import nvml_source

ALLOCATION_MIB = 1024

ALLOCATE = """
import sys, time, torch
x = torch.empty({mib} * 2**20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(120)
"""


@pytest.mark.gpu
def test_the_monitor_measures_a_cuda_process_of_known_size_on_a_real_gpu():
    try:
        nvml = nvml_source.load_pynvml()
    except nvml_source.NvmlUnavailable as exc:
        pytest.skip(f"no NVIDIA driver/GPU here: {exc}")
    try:
        import torch  # noqa: F401 - only to know whether the child can allocate
    except ImportError:
        nvml.nvmlShutdown()
        pytest.skip("PyTorch is not installed: it allocates the known amount of GPU memory")
    try:
        node = nvml_source.discover(nvml)
        shared = gpu_usage.shared_devices(node)
        if not shared:
            pytest.skip("every GPU here is in MIG mode without MIG devices")
        device, gpu = shared[0]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": device}
        child = subprocess.Popen(
            [sys.executable, "-c", ALLOCATE.format(mib=ALLOCATION_MIB)], env=env, stdout=subprocess.PIPE, text=True
        )
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
            reader = gpu_usage.UsageReader(nvml, ((device, gpu),))
            asked_at = cgroups.uptime_seconds()
            started = time.perf_counter()
            (sample,) = reader.read()
            read_ms = (time.perf_counter() - started) * 1000
            assert sample.ok, sample.error
            mine = {p.pid: p.used_mib for p in sample.processes}
            print(
                f"\n{device}: {sample.used_mib}/{sample.total_mib} MiB used, processes {mine}, "
                f"utilisation {sample.utilization}%, per-process SM {sample.process_utilization}, "
                f"one NVML read {read_ms:.1f} ms"
            )
            assert child.pid in mine, f"NVML does not list the CUDA process {child.pid}: {mine}"
            used = mine[child.pid]
            assert used is not None and ALLOCATION_MIB <= used < ALLOCATION_MIB + 2048  # + the CUDA context
            identity = cgroups.read(child.pid, started_by=asked_at)
            assert identity is not None and identity.pid == child.pid
            print(f"process {child.pid}: {used} MiB for a {ALLOCATION_MIB} MiB tensor; cgroup -> {identity.container}")
            # Attribute it as if the process were container main of a pod granted half the tensor.
            as_pod = cgroups.Identity(child.pid, identity.start_ticks, cgroups.ContainerRef("u-1", "c" * 64))
            pods = [podapi.PodInfo("u-1", "gpu-test", "pod", {"c" * 64: "main"})]
            grants = {("gpu-test", "pod", "main"): {device: ALLOCATION_MIB // 2}}
            snapshot = attribution.attribute([sample], {**{p: None for p in mine}, child.pid: as_pod}, pods, grants)
            (use,) = snapshot.containers
            assert use.used_mib == used and use.granted_mib == ALLOCATION_MIB // 2
            detector = overuse.Detector(tolerance_mib=0, seconds=0.0)
            (due,) = detector.update(snapshot)
            assert due.use.key == use.key
        finally:
            child.kill()
            child.wait()
    finally:
        nvml.nvmlShutdown()
