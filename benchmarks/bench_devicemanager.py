"""GetPreferredAllocation + Allocate as kubelet's real device manager calls them.

Starts dmharness (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager, built by e2e/k8s/build.sh) and the real
`gpuslice-device-plugin --node-file` process for a simulated node (default: 8 x H200 141 GB, 4,488 memory
units at 256 MiB), then admits a seeded mix of pods (from one unit to two whole GPUs) the way kubelet does:
the manager asks the plugin's GetPreferredAllocation with every free device as available, then calls
Allocate. Pods are released at random to keep the node between about 30 % and 75 % full.

The figure is the manager's own time per admission (`allocateSeconds` in the harness's answer: both gRPC
calls to the plugin, their Go/Python serialisation and the manager's bookkeeping), without the harness's
HTTP API; the round trip over that API is reported beside it.

    .venv/bin/python benchmarks/bench_devicemanager.py [--pods 2000] [--node-file FILE] [--seed 1] [--bin DIR]
                                                       [--memory-unit-mib 256]
                                                       [--pprof FILE [--pprof-seconds N]]

DIR (or $GPUSLICE_K8S_BIN, or the output of e2e/k8s/build.sh) holds dmharness. Target (issue 10): p99 <= 5 ms.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

from gpuslice import config
from gpuslice.deviceplugin import manager
from gpuslice.node import nodefile
from gpuslice.sim import controlplane

REPO = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_NODE = REPO / "gpuslice" / "examples" / "h200x8-node.yaml"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def request_sizes(units_per_gpu: int) -> list[tuple[int, float]]:
    """(units, weight): mostly shares of one GPU, some whole GPUs (the mix bench_allocation.py uses)."""
    return [
        (1, 2), (4, 3), (8, 3), (16, 3), (32, 3), (64, 2), (128, 2),
        (units_per_gpu // 4, 2), (units_per_gpu // 2, 2), (units_per_gpu, 1), (2 * units_per_gpu, 0.5),
    ]  # fmt: skip


def _kind(error: str) -> str:
    """Refusals grouped by kind (device IDs and counts dropped)."""
    if "span" in error:
        return "units would span GPUs (no single GPU had room)"
    if "unavailable" in error:
        return "requested number of devices unavailable"
    return error[:100]


def binaries(directory: str | None) -> controlplane.Binaries:
    found = controlplane.find_binaries(directory)
    if found is None:
        built = subprocess.run(
            ["bash", str(REPO / "e2e" / "k8s" / "build.sh")], check=True, capture_output=True, text=True
        )
        found = controlplane.find_binaries(built.stdout.strip().splitlines()[-1])
    if found is None:
        sys.exit("bench_devicemanager: no dmharness: run `make k8s` (needs Go) or pass --bin")
    return found


def post(url: str, body: object | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else b""
    request = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - loopback
            raw = response.read()
            return response.status, json.loads(raw) if raw else {}
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def run(args: argparse.Namespace) -> dict[str, object]:
    found = binaries(args.bin)
    node = nodefile.load(args.node_file)
    settings = config.Config(memory_unit_mib=args.memory_unit_mib)
    resource = next(r for r in manager.build_resources(node, settings) if r.name.endswith("/gpu-memory"))
    total_units = len(resource.device_ids)
    units_per_gpu = min(g.memory_mib // settings.memory_unit_mib for g in node.memory_gpus)
    rng = random.Random(args.seed)
    sizes, weights = zip(*request_sizes(units_per_gpu), strict=True)

    with tempfile.TemporaryDirectory(prefix="gs-bench-dm-") as tmp:
        plane = controlplane.ControlPlane(found, tmp)
        try:
            socket_dir = pathlib.Path(tmp) / "device-plugins"
            socket_dir.mkdir()
            port = controlplane.free_port()
            harness = plane.spawn(
                "dmharness",
                [str(found.path("dmharness")), f"--socket-dir={socket_dir}", f"--listen=127.0.0.1:{port}", "--v=0"],
            )
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while not (socket_dir / "kubelet.sock").exists():
                if time.monotonic() > deadline or harness.popen.poll() is not None:
                    sys.exit(f"dmharness did not start:\n{harness.tail()}")
                time.sleep(0.1)
            plane.spawn(
                "device-plugin",
                [sys.executable, "-m", "gpuslice.deviceplugin.main", f"--node-file={args.node_file}",
                 f"--kubelet-dir={socket_dir}", "--http-port=0", "--log-level=WARNING",
                 f"--memory-unit-mib={args.memory_unit_mib}"],
                env={"PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
            while True:
                with urllib.request.urlopen(base + "/capacity", timeout=5) as response:  # noqa: S310 - loopback
                    if int(json.loads(response.read())["allocatable"].get(resource.name, "0")) == total_units:
                        break
                if time.monotonic() > deadline:
                    sys.exit("the plugin did not register with dmharness")
                time.sleep(0.1)

            profiler = None
            if args.pprof:
                # Go's CPU profile of dmharness over the first --pprof-seconds of the admissions.
                def fetch() -> None:
                    url = f"{base}/debug/pprof/profile?seconds={args.pprof_seconds}"
                    with urllib.request.urlopen(url, timeout=args.pprof_seconds + 30) as response:  # noqa: S310
                        args.pprof.write_bytes(response.read())

                profiler = threading.Thread(target=fetch, name="pprof")
                profiler.start()
            held: list[tuple[str, int]] = []
            used = 0
            manager_seconds: list[float] = []
            round_trips: list[float] = []
            refused: collections.Counter[str] = collections.Counter()
            for i in range(args.pods):
                while held and (used > 0.75 * total_units or (used > 0.3 * total_units and rng.random() < 0.45)):
                    uid, size = held.pop(rng.randrange(len(held)))
                    post(f"{base}/remove?uid={uid}")
                    used -= size
                size = rng.choices(sizes, weights)[0]
                pod = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": f"bench-{i}", "namespace": "bench", "uid": str(uuid.uuid4())},
                    "spec": {"containers": [{"name": "main", "resources": {"limits": {resource.name: str(size)}}}]},
                }
                started = time.perf_counter()
                status, answer = post(f"{base}/admit", pod)
                round_trips.append(time.perf_counter() - started)
                if status != 200:
                    refused[_kind(str(answer.get("error", status)))] += 1
                    continue
                manager_seconds.append(float(answer["allocateSeconds"]))
                held.append((pod["metadata"]["uid"], size))
                used += size
            if profiler is not None:
                profiler.join()
        finally:
            plane.stop()

    def ms(values: list[float], q: float) -> float:
        return round(1000 * percentile(values, q), 2)

    return {
        "kubernetes": found.version,
        "node": args.node_file.name,
        "unit_mib": args.memory_unit_mib,
        "units": total_units,
        "pods": args.pods,
        "admitted": len(manager_seconds),
        "refused": dict(refused),
        "manager_ms": {
            "p50": ms(manager_seconds, 50),
            "p99": ms(manager_seconds, 99),
            "mean": round(1000 * statistics.fmean(manager_seconds), 2),
        },
        "round_trip_ms": {"p50": ms(round_trips, 50), "p99": ms(round_trips, 99)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--node-file", type=pathlib.Path, default=DEFAULT_NODE)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--memory-unit-mib", type=int, default=256, help="the plugin's unit size (default 256)")
    parser.add_argument("--bin", default=os.environ.get(controlplane.BIN_ENV), help="directory of the built components")
    parser.add_argument("--pprof", type=pathlib.Path, metavar="FILE", help="write a Go CPU profile of dmharness here")
    parser.add_argument(
        "--pprof-seconds", type=int, default=20, metavar="N", help="length of that profile (default 20)"
    )
    print(json.dumps(run(parser.parse_args()), indent=2))


if __name__ == "__main__":
    main()
