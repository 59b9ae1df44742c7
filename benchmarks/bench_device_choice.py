"""Does the GPU a share lands on within its node change the packing? The DRA allocator takes the
first device with room (slice order: the lowest GPU index); the device plugin takes the tightest
(GetPreferredAllocation's best fit). The model (sim/replay.py, one pod at a time, the full trace,
gpuslice-default) is run both ways on the same arrivals, seed by seed.

    .venv/bin/python benchmarks/bench_device_choice.py [--trace-dir DIR] [--seeds 2]

Needs the Alibaba trace (--trace-dir or $GPUSLICE_TRACE_DIR). First fit replaces the policy's best
fit in-process (node.allocation.MemoryUnits._best_fit), for this run only.
"""

from __future__ import annotations

import argparse
import os
import pathlib
from collections.abc import Collection, Mapping

import numpy as np

from gpuslice import config
from gpuslice.node import allocation
from gpuslice.sim import replay, trace

BEST_FIT = allocation.MemoryUnits._best_fit


def first_fit(
    self: allocation.MemoryUnits, counts: Mapping[str, int], must_gpus: Collection[str], size: int
) -> str | None:
    """The lowest-index GPU with `size` units free, as the DRA allocator takes devices in slice order."""
    if len(must_gpus) > 1:
        return None
    for gpu in self._gpu_order:
        if counts.get(gpu, 0) >= size and (not must_gpus or gpu in must_gpus):
            return gpu
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace-dir", default=os.environ.get("GPUSLICE_TRACE_DIR"))
    parser.add_argument("--pods", default="openb_pod_list_default.csv")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--seeds", type=int, default=2)
    args = parser.parse_args()
    if not args.trace_dir:
        parser.error("--trace-dir (or $GPUSLICE_TRACE_DIR): the Alibaba trace's directory")
    directory = pathlib.Path(args.trace_dir)
    nodes = trace.load_nodes(directory / "openb_node_list_gpu_node.csv")
    pods = trace.load_pods(directory / args.pods)
    capacity = replay.gpu_capacity_milli(nodes)
    configuration = replay.configurations(config.load(overrides={}, environ={}))["gpuslice-default"]
    print("seed  best fit  first fit  (granted, one pod at a time)")
    for seed in range(args.seed, args.seed + args.seeds):
        arrivals = replay.workload(pods, capacity, 1.3, np.random.default_rng(seed))
        granted = []
        for choice in (BEST_FIT, first_fit):
            allocation.MemoryUnits._best_fit = choice  # type: ignore[method-assign]
            try:
                granted.append(replay.replay(nodes, arrivals, configuration, seed=seed).gpu_allocation_ratio)
            finally:
                allocation.MemoryUnits._best_fit = BEST_FIT  # type: ignore[method-assign]
        print(f"{seed:4d}  {granted[0]:8.2%}  {granted[1]:9.2%}", flush=True)


if __name__ == "__main__":
    main()
