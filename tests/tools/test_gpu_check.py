"""tools/gpu-check.py where there is no GPU: without a driver it says so and exits 2; on the NVML
built on go-nvml's mock GPUs (e2e/nvml, $GPUSLICE_NVML_DIR) its NVML stage runs and reports, and a
machine with NVML but no CUDA driver library fails the monitor stage naming libcuda, exit 1."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

TOOL = pathlib.Path(__file__).resolve().parents[2] / "tools" / "gpu-check.py"


def run(tmp_path: pathlib.Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, str(TOOL), "--report", str(report)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done, json.loads(report.read_text()) if report.exists() else []


def test_without_a_driver_it_says_so_and_exits_2(tmp_path):
    done, stages = run(tmp_path, {"LD_LIBRARY_PATH": str(tmp_path)})  # no libnvidia-ml anywhere here
    if "PASS nvml" in done.stdout:
        pytest.skip("this machine has an NVIDIA driver")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "SKIP nvml" in done.stdout and "no NVIDIA driver or GPU" in done.stdout
    assert [s["result"] for s in stages] == ["SKIP"]


def test_on_the_mock_nvml_it_reports_the_gpus_and_fails_without_a_cuda_driver(tmp_path):
    nvml_dir = os.environ.get("GPUSLICE_NVML_DIR")
    if not nvml_dir:
        if os.environ.get("GPUSLICE_REQUIRE_E2E") == "1":
            pytest.fail("GPUSLICE_REQUIRE_E2E=1 but GPUSLICE_NVML_DIR is not set (make node)")
        pytest.skip("the NVML mock is not built (GPUSLICE_NVML_DIR; e2e/nvml/build.sh)")
    state = tmp_path / "state.json"
    state.write_text("{}")
    env = {"LD_LIBRARY_PATH": nvml_dir, "GPUSLICE_NVML_MOCK_MACHINE": "dgxh200", "GPUSLICE_NVML_MOCK_STATE": str(state)}
    done, stages = run(tmp_path, env)
    assert done.returncode == 1, done.stdout + done.stderr
    nvml, monitor, mps = stages
    assert nvml["result"] == "PASS" and nvml["facts"]["raw"]["nvmlDeviceGetName"]["value"] == "NVIDIA H200"
    assert sum("GPU " in line and "561 units" in line for line in nvml["lines"]) == 8
    assert monitor["result"] == "FAIL" and "libcuda.so.1" in " ".join(monitor["lines"])
    assert mps["result"] in ("SKIP", "FAIL")  # no nvidia-cuda-mps-control here, or no CUDA for its clients
