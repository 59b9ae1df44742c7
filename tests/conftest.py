"""Shared fixtures: the example node files, paths to ../shared data, a check for leftover asyncio tasks."""

from __future__ import annotations

import asyncio
import os
import pathlib
from collections.abc import AsyncIterator

import pytest

from gpuslice import config
from gpuslice.node import inventory, nodefile

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
            "set GPUSLICE_TRACE_DIR or put shared/data beside the checkout "
            '(docs/simulator.md, "Reproducing the headline")'
        )
    return TRACE_DIR


@pytest.fixture
async def no_leftover_tasks() -> AsyncIterator[None]:
    """Fails a test that leaves asyncio tasks running (plugins, streams, health loops)."""
    before = asyncio.all_tasks()
    yield
    # Cancelled tasks (and gRPC's own, for calls a stopped server ended) take a few turns of the
    # loop to finish, more on a loaded machine: a leak is a task still running a second later.
    left = [t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()]
    if left:
        await asyncio.wait(left, timeout=1.0)
    running = [t for t in left if not t.done()]
    assert not running, f"tasks left running: {sorted(f'{t.get_name()} ({t.get_coro()!r})' for t in running)}"
