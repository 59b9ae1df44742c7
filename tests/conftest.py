"""Shared fixtures: the example node files and paths to ../shared data."""

from __future__ import annotations

import os
import pathlib

import pytest

from gpuslice import config
from gpuslice.deviceplugin import inventory, nodefile

REPO = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "gpuslice" / "examples"
SHARED = pathlib.Path(os.environ.get("GPUSLICE_SHARED_DIR", REPO.parent / "shared"))
TRACE_DIR = pathlib.Path(os.environ.get("GPUSLICE_TRACE_DIR", SHARED / "data" / "alibaba-gpu-2023"))


@pytest.fixture
def demo_node() -> inventory.NodeInventory:
    return nodefile.load(EXAMPLES / "demo-node.yaml")


@pytest.fixture
def h200_node() -> inventory.NodeInventory:
    return nodefile.load(EXAMPLES / "h200x8-node.yaml")


@pytest.fixture
def settings() -> config.Config:
    return config.Config()


@pytest.fixture
def trace_dir() -> pathlib.Path:
    if not (TRACE_DIR / "openb_node_list_gpu_node.csv").exists():
        pytest.skip(
            f"Alibaba GPU trace not found at {TRACE_DIR}: it is not in the repository (research-use licence); "
            "set GPUSLICE_TRACE_DIR or put shared/data beside the checkout"
        )
    return TRACE_DIR
