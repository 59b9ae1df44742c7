"""CPU cost of one usage-monitor round in the plugin, without NVML's own time.

Builds a busy node (default: 8 x H200, 16 pods per GPU, 2 CUDA processes each = 256 GPU
processes) with the fake NVML (tests/fake_nvml.py) and a fake /proc tree on disk, then times the
parts of a round that run in the plugin's process: reading each process's identity from /proc
(stat, cgroup, stat), the join with pods and grants, and rendering the Prometheus scrape. The
fake NVML's own time is reported separately and says nothing of a real driver (on a GPU, run
tests/deviceplugin/test_monitor_gpu.py, which prints one real NVML read).

    .venv/bin/python benchmarks/bench_monitor.py [--pods-per-gpu 16] [--processes 2] [--rounds 50]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile
import time

import prometheus_client

from gpuslice import contract
from gpuslice.deviceplugin import attribution, cgroups, gpu_usage, podapi, usage_metrics
from gpuslice.node import nodefile, podresources

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
from fake_nvml import FakeNvml  # noqa: E402 - a test helper
from fake_proc import FakeProc  # noqa: E402

NODE = pathlib.Path(__file__).resolve().parent.parent / "gpuslice" / "examples" / "h200x8-node.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods-per-gpu", type=int, default=16)
    parser.add_argument("--processes", type=int, default=2, help="CUDA processes per pod")
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    node = nodefile.load(NODE)
    names = contract.Contract()
    nvml = FakeNvml(node)
    nvml.nvmlInit()
    units_per_pod = names.units_per_gpu(node.gpus[0].memory_mib) // args.pods_per_gpu
    with tempfile.TemporaryDirectory(prefix="gs-bench-proc-") as root:
        proc = FakeProc(pathlib.Path(root))
        holdings, pods, pid = [], [], 1000
        for g, gpu in enumerate(node.memory_gpus):
            for p in range(args.pods_per_gpu):
                uid = f"{g:08x}-{p:04x}-4000-8000-{g * 1000 + p:012x}"
                cid = f"{g:032x}{p:032x}"
                name = f"pod-{g}-{p}"
                ids = tuple(names.unit_device_id(gpu.uuid, p * units_per_pod + i) for i in range(units_per_pod))
                holdings.append(podresources.ContainerDevices("bench", name, "main", names.gpu_memory_resource, ids))
                pods.append(podapi.PodInfo(uid, "bench", name, {cid: "main"}))
                for _ in range(args.processes):
                    pid += 1
                    proc.add_container_process(pid, uid, cid)
                    nvml.add_process(gpu.uuid, pid, units_per_pod * names.unit_mib // args.processes)
                    nvml.set_process_utilization(gpu.uuid, pid, 10)
        reader = gpu_usage.UsageReader(nvml, gpu_usage.shared_devices(node))
        grants = attribution.grants_of(holdings, node, names)
        snapshot: attribution.Snapshot | None = None
        registry = prometheus_client.CollectorRegistry()
        usage_metrics.SnapshotCollector(lambda: snapshot, frozenset, frozenset).register(registry)
        timings: dict[str, list[float]] = {"fake NVML read": [], "/proc identities": [], "join": [], "scrape": []}
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            samples = reader.read()
            t1 = time.perf_counter()
            asked = cgroups.uptime_seconds(proc.path)
            identities = {p.pid: cgroups.read(p.pid, proc.path, started_by=asked) for s in samples for p in s.processes}
            t2 = time.perf_counter()
            snapshot = attribution.attribute(samples, identities, pods, grants)
            t3 = time.perf_counter()
            text = prometheus_client.generate_latest(registry)
            t4 = time.perf_counter()
            for key, value in zip(timings, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                timings[key].append(value * 1000)
        processes = sum(len(s.processes) for s in samples)
        print(
            f"node {NODE.name}: {len(node.memory_gpus)} GPUs, {len(pods)} pods, {processes} GPU processes, "
            f"{args.rounds} rounds, scrape {len(text) // 1024} KiB"
        )
        for key, values in timings.items():
            print(f"  {key:18s} median {statistics.median(values):7.2f} ms   max {max(values):7.2f} ms")
        own = [sum(v) for v in zip(*(timings[k] for k in ("/proc identities", "join")), strict=True)]
        print(f"  plugin-side round (identities + join), median {statistics.median(own):.2f} ms")


if __name__ == "__main__":
    main()
