"""How long the controller is without a leader when its leader goes, on the real API server.

Two `gpuslice-controller` replicas (the real command, requeue on, the chart's default Lease of
15 s) run against a real kube-apiserver and etcd (e2e/k8s); the leader is stopped, either cleanly
(SIGTERM: it gives the Lease up) or killed (SIGKILL: the Lease must expire), and the time from the
signal to the standby's `gpuslice_controller_leading 1` is taken; the stopped replica is started
again as the new standby, and the next round stops the other. Also measured: each replica's
resident memory while it leads and while it stands by, and how many Failed pods it holds then.

    GPUSLICE_K8S_BIN=$(cat .k8s-bin) .venv/bin/python benchmarks/bench_failover.py [--rounds 5] \
        [--lease-seconds 15] [--failed-pods 200]

Figures go in docs/benchmarks.md ("Controller failover").
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from typing import Any

import kubernetes
import yaml

from gpuslice.sim import controlplane, kube_components

NAMESPACE = "default"


def metric(port: int, name: str) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:  # noqa: S310
            text = answer.read().decode()
    except OSError:
        return None
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(f"{name} ")]
    return values[0] if values else None


def rss_mib(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def failed_pods(core: kubernetes.client.CoreV1Api, count: int) -> None:
    """`count` Failed pods that no requeuer touches (no decision annotation): what a cluster's finished
    Jobs leave, which every replica lists and keeps."""
    for i in range(count):
        pod = core.create_namespaced_pod(
            NAMESPACE,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"done-{i}"},
                "spec": {"nodeName": "nowhere", "containers": [{"name": "c", "image": "x"}]},
            },
        )
        pod.status = kubernetes.client.V1PodStatus(phase="Failed", reason="Completed")
        core.replace_namespaced_pod_status(f"done-{i}", NAMESPACE, pod)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="failovers of each kind")
    parser.add_argument("--lease-seconds", type=int, default=15, help="controller.leaseSeconds (chart default 15)")
    parser.add_argument("--failed-pods", type=int, default=200, help="Failed pods every replica holds")
    args = parser.parse_args()
    binaries = controlplane.find_binaries()
    if binaries is None:
        print("bench_failover: no Kubernetes binaries (GPUSLICE_K8S_BIN; make k8s)", file=sys.stderr)
        return 2
    with (
        tempfile.TemporaryDirectory(prefix="gpuslice-failover-") as tmp,
        controlplane.ControlPlane(binaries, tmp) as plane,
    ):
        plane.start(scheduler=False, controllers=False)  # no pod GC: the Failed pods stay
        core = kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config(config_file=plane.admin_kubeconfig))
        failed_pods(core, args.failed_pods)
        config_file = pathlib.Path(tmp) / "config.yaml"
        config_file.write_text(yaml.safe_dump({"version": "v1", "controller": {"leaseSeconds": args.lease_seconds}}))
        replicas: dict[str, tuple[Any, int]] = {}

        def start(name: str) -> None:
            replicas[name] = kube_components.start_controller(
                plane, config_file, str(plane.admin_kubeconfig), name=name
            )

        def leader() -> str | None:
            leading = [n for n, (_, port) in replicas.items() if metric(port, "gpuslice_controller_leading") == 1.0]
            return leading[0] if len(leading) == 1 else None

        start("a")
        deadline = time.monotonic() + 60
        while leader() != "a" and time.monotonic() < deadline:
            time.sleep(0.05)
        start("b")
        time.sleep(2)
        memory = {
            "leader_rss_mib": round(rss_mib(replicas["a"][0].popen.pid), 1),
            "standby_rss_mib": round(rss_mib(replicas["b"][0].popen.pid), 1),
        }
        results: dict[str, list[float]] = {"clean stop (SIGTERM)": [], "crash (SIGKILL)": []}
        for kind, sig in (("clean stop (SIGTERM)", signal.SIGTERM), ("crash (SIGKILL)", signal.SIGKILL)):
            for _ in range(args.rounds):
                old = leader()
                assert old is not None, "no single leader"
                process, _ = replicas.pop(old)
                t0 = time.monotonic()
                os.killpg(process.popen.pid, sig)
                while leader() is None:
                    if time.monotonic() - t0 > 4 * args.lease_seconds:
                        raise RuntimeError("no new leader")
                    time.sleep(0.02)
                results[kind].append(time.monotonic() - t0)
                process.popen.wait(timeout=30)
                plane.processes.remove(process)
                start(old)  # back as the standby
                time.sleep(1)
        report = {
            "lease_seconds": args.lease_seconds,
            "failed_pods_held": args.failed_pods,
            **memory,
            **{
                kind: {
                    "median_s": round(statistics.median(times), 2),
                    "min_s": round(min(times), 2),
                    "max_s": round(max(times), 2),
                    "rounds": len(times),
                }
                for kind, times in results.items()
            },
        }
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
