"""How the webhook and the controller start on a large cluster: memory, readiness and admissions.

    GPUSLICE_K8S_BIN=$(cat .k8s-bin) .venv/bin/python benchmarks/bench_scale.py \
        [--nodes 5000] [--pods 100000] [--pending 60000] [--repeats 3] [--baseline DIR] [--lists-only ROUNDS]

A real kube-apiserver and etcd (e2e/k8s) are grown to `--nodes` GPU nodes and `--pods` pods, as a
kubelet and our webhook write them:
- each node as kubelet registers it (its 50 largest images, five conditions, addresses, node info,
  allocatable and capacity with the device plugin's gpu-memory units) with the device plugin's
  labels, in the Alibaba trace's GPU models (bench_webhook.node_labels);
- each pod a KAI `gpu-fraction` pod of a Deployment (twenty environment variables, a volume, a
  probe) as our webhook converts it (admission.review's patch applied: 5.5 KB as stored, half of
  it the steering preferences the webhook writes); `--pods` minus
  `--pending` of them bound to a node and Running (status as kubelet writes it), the rest pending
  and not yet marked by the scheduler: the worst case for the webhook, which promises each of
  them as another replica's conversion.

Then each component starts alone against that API server, `--repeats` times (medians reported, every
run kept), and is sampled every 0.1 s:
- `gpuslice-webhook` (chart defaults): its resident memory (peak: VmHWM; settled: 20 s after it is
  ready), when its /readyz first answers 200, and one AdmissionReview (a gpu-fraction pod) posted
  every 0.2 s over one keep-alive HTTPS connection from the moment its port accepts until 20 s
  after it is ready: the slowest answer, and any not answered within 10 s;
- `gpuslice-controller` with the chart's defaults (the requeuer) and with `pacing.enabled` (the
  pacer too): memory and readiness the same way.
`--lists-only ROUNDS` measures instead what the largest list costs the API server: the pacer's
(every unfinished pod, as a watch's initial events) read as JSON and as protobuf, alternated: its
CPU and the wall time to the bookmark that ends the list (the reader only counts bytes).
`--baseline DIR` runs every measurement a second time with the gpuslice package of another source
tree (`git archive <commit> | tar -x -C DIR`), in the same sitting: before and after a change.

Figures go in docs/benchmarks.md ("Cluster scale").
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import copy
import http.client
import json
import os
import pathlib
import random
import ssl
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Mapping
from typing import Any

import bench_webhook  # benchmarks/ is the script's folder: its node mix and labels
import jsonpatch
import yaml

from gpuslice import config
from gpuslice.sim import controlplane, kube_api, kube_components
from gpuslice.webhook import admission

NAMESPACES = 100
SAMPLE_SECONDS = 0.1
PROBE_SECONDS = 0.2
SETTLE_SECONDS = 20.0
START_TIMEOUT = 600.0


# --- growing the API server -----------------------------------------------------------------


def kubelet_node(name: str, labels: Mapping[str, str], contract: Any) -> dict[str, Any]:
    """A node as kubelet registers it and the device plugin labels it."""
    units = sum(
        contract.units_per_gpu(int(labels[contract.label_gpu_memory_mib]))
        for _ in range(int(labels[contract.label_gpu_count]))
    )
    amounts = {
        "cpu": "96",
        "memory": "393216Mi",
        "pods": "110",
        "ephemeral-storage": "1Ti",
        contract.gpu_memory_resource: str(units),
    }
    now = "2026-11-29T00:00:00Z"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **labels}},
        "spec": {"podCIDR": "10.244.0.0/24"},
        "status": {
            "allocatable": amounts,
            "capacity": amounts,
            "conditions": [
                {
                    "type": kind,
                    "status": "False",
                    "reason": f"Kubelet{kind}",
                    "message": "kubelet has no problem",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
                for kind in ("MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable")
            ]
            + [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": "0" * 32,
                "systemUUID": "0" * 36,
                "bootID": "0" * 36,
                "kernelVersion": "6.8.0",
                "osImage": "Ubuntu 24.04",
                "containerRuntimeVersion": "containerd://2.1.0",
                "kubeletVersion": "v1.37.2",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": [
                {
                    "names": [
                        f"registry.example/team-{i}/trainer@sha256:{i:064x}",
                        f"registry.example/team-{i}/trainer:v{i}",
                    ],
                    "sizeBytes": 10**9 + i,
                }
                for i in range(50)
            ],
        },
    }


def converted_pod(settings: config.Config) -> dict[str, Any]:
    """A Deployment's KAI gpu-fraction pod as our webhook converts it (its patch applied)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "labels": {"app": "trainer", "pod-template-hash": "7c9f8d6b5"},
            "annotations": {"gpu-fraction": "0.5"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "trainer-7c9f8d6b5",
                    "uid": "0b7f3c1e-6a39-4b8e-9a57-2f1d3c0e9a11",
                    "controller": True,
                }
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.example/ml/trainer:2.3.1",
                    "args": ["--epochs", "10", "--data", "/data"],
                    "env": [{"name": f"SETTING_{i}", "value": "x" * 60} for i in range(20)],
                    "resources": {
                        "requests": {"cpu": "4", "memory": "16Gi"},
                        "limits": {"memory": "16Gi", "nvidia.com/gpu": "1"},
                    },
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 5},
                }
            ],
            "volumes": [{"name": "data", "configMap": {"name": "trainer-data"}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }
    review = admission_review(pod, uid="grow", dry_run=False)
    answer = admission.review(review, settings=settings, cluster=bench_webhook.cluster_view(settings)).response[
        "response"
    ]
    return jsonpatch.apply_patch(pod, json.loads(base64.b64decode(answer["patch"])))


def running_status(node: str, index: int) -> dict[str, Any]:
    now = "2026-11-29T00:00:00Z"
    return {
        "status": {
            "phase": "Running",
            "hostIP": "10.0.0.1",
            "podIP": f"10.{index // 65536 % 256}.{index // 256 % 256}.{index % 256}",
            "startTime": now,
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": now}
                for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "containerStatuses": [
                {
                    "name": "trainer",
                    "ready": True,
                    "restartCount": 0,
                    "started": True,
                    "image": "registry.example/ml/trainer:2.3.1",
                    "imageID": f"registry.example/ml/trainer@sha256:{0:064x}",
                    "containerID": f"containerd://{index:064x}",
                    "state": {"running": {"startedAt": now}},
                }
            ],
        }
    }


async def grow(
    plane: controlplane.ControlPlane, settings: config.Config, nodes: int, pods: int, pending: int
) -> dict[str, float]:
    contract = settings.contract
    template = converted_pod(settings)
    names = [f"node-{i:05d}" for i in range(nodes)]
    labels = bench_webhook.node_labels(settings, random.Random(7), range(nodes))
    timing: dict[str, float] = {}
    async with kube_api.Api(plane.server, plane.admin_token, plane.ca_file, connections=48) as api:

        async def each(jobs: Any, limit: int = 48) -> None:
            queue: asyncio.Queue[Any] = asyncio.Queue()
            for job in jobs:
                queue.put_nowait(job)

            async def worker() -> None:
                while not queue.empty():
                    await queue.get_nowait()

            await asyncio.gather(*(worker() for _ in range(limit)))

        started = time.monotonic()
        await each(
            api.create("/api/v1/nodes", kubelet_node(name, node_labels, contract))
            for name, (_, node_labels) in zip(names, labels, strict=True)
        )
        await each(api.create("/api/v1/namespaces", {"metadata": {"name": f"team-{i:03d}"}}) for i in range(NAMESPACES))
        timing["nodes_s"] = time.monotonic() - started

        def pod(index: int) -> dict[str, Any]:
            manifest = copy.deepcopy(template)
            manifest["metadata"]["name"] = f"trainer-7c9f8d6b5-{index:06d}"
            if index >= pending:
                manifest["spec"]["nodeName"] = names[index % nodes]
            return manifest

        async def create(index: int) -> None:
            namespace = f"team-{index % NAMESPACES:03d}"
            path = f"/api/v1/namespaces/{namespace}/pods"
            await api.create(path, pod(index))
            if index >= pending:
                await api.merge_patch(
                    f"{path}/trainer-7c9f8d6b5-{index:06d}/status", running_status(names[index % nodes], index)
                )

        started = time.monotonic()
        done = 0
        for first in range(0, pods, 5000):
            await each(create(i) for i in range(first, min(pods, first + 5000)))
            done = min(pods, first + 5000)
            print(f"  {done} pods, {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
        timing["pods_s"] = time.monotonic() - started
    return timing


# --- measuring one component ----------------------------------------------------------------


def memory_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of `pid`, KiB."""
    fields = {}
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields["VmRSS"], fields["VmHWM"]


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of `pid` so far."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stream_all_pods(plane: controlplane.ControlPlane, accept: str) -> int:
    """Read the pacer's list (every unfinished pod, as a watch's initial events) as `accept` asks,
    up to the bookmark that ends it; the bytes read."""
    query = (
        "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
        "&timeoutSeconds=300&fieldSelector=status.phase!%3DSucceeded,status.phase!%3DFailed"
    )
    request = urllib.request.Request(
        f"{plane.server}/api/v1/pods?{query}",
        headers={"Authorization": f"Bearer {plane.admin_token}", "Accept": accept},
    )
    end = b"k8s.io/initial-events-end"
    total, tail = 0, b""
    with urllib.request.urlopen(request, context=ssl.create_default_context(cafile=plane.ca_file)) as response:
        while chunk := response.read1(1 << 20):
            total += len(chunk)
            if end in tail + chunk:
                break
            tail = chunk[-len(end) :]
    return total


def list_costs(plane: controlplane.ControlPlane, rounds: int) -> dict[str, list[dict[str, float]]]:
    """The API server's CPU and the wall time for the pacer's list as JSON and as protobuf
    (gpuslice.podwire), alternated `rounds` times; the reader here only counts the bytes."""
    apiserver = next(p for p in plane.processes if p.name == "kube-apiserver").popen.pid
    encodings = {"json": "application/json", "protobuf": "application/vnd.kubernetes.protobuf;stream=watch"}
    costs: dict[str, list[dict[str, float]]] = {name: [] for name in encodings}
    for _ in range(rounds):
        for name, accept in encodings.items():
            cpu, started = cpu_seconds(apiserver), time.monotonic()
            size = stream_all_pods(plane, accept)
            costs[name].append(
                {
                    "wall_s": round(time.monotonic() - started, 2),
                    "apiserver_cpu_s": round(cpu_seconds(apiserver) - cpu, 2),
                    "mb": round(size / 1e6),
                }
            )
            print(f"  list as {name}: {costs[name][-1]}", file=sys.stderr, flush=True)
    return costs


class Prober(threading.Thread):
    """Posts one AdmissionReview every PROBE_SECONDS over one keep-alive HTTPS connection (made
    again when it fails) until `stop`; keeps (seconds since `t0`, latency or None when unanswered)."""

    def __init__(self, port: int, ca_file: str, body: bytes, t0: float) -> None:
        super().__init__(daemon=True)
        self.port, self.body, self.t0 = port, body, t0
        self.context = ssl.create_default_context(cafile=ca_file)
        self.stop = threading.Event()
        self.answers: list[tuple[float, float | None]] = []
        self.first: float | None = None

    def run(self) -> None:
        connection: http.client.HTTPSConnection | None = None
        while not self.stop.is_set():
            began = time.monotonic()
            try:
                if connection is None:
                    connection = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context, timeout=10)
                    connection.connect()
                    began = time.monotonic()
                connection.request("POST", "/mutate", self.body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
                ok = response.status == 200
                latency = time.monotonic() - began
                if self.first is None:
                    self.first = began - self.t0
                self.answers.append((began - self.t0, latency if ok else None))
            except ConnectionRefusedError:
                connection = None  # not listening yet: not an admission the API server would send
            except (OSError, http.client.HTTPException):
                if self.first is not None:
                    self.answers.append((began - self.t0, None))
                connection = None
            self.stop.wait(max(0.0, PROBE_SECONDS - (time.monotonic() - began)))


def probe_body(settings: config.Config) -> bytes:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe", "annotations": {"gpu-fraction": "0.5"}},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }
    return json.dumps(admission_review(pod, uid="probe", dry_run=True)).encode()


def admission_review(pod: dict[str, Any], *, uid: str, dry_run: bool) -> dict[str, Any]:
    """The AdmissionReview kube-apiserver sends for the CREATE of `pod` in team-000."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "team-000",
            "operation": "CREATE",
            "object": pod,
            "dryRun": dry_run,
        },
    }


def ready(url: str, ca_file: str | None) -> bool:
    try:
        if ca_file is not None:
            status, _ = controlplane._https_get(url, ca_file, timeout=2)
            return status == 200
        with urllib.request.urlopen(url, timeout=2) as answer:  # noqa: S310 - loopback
            return bool(answer.status == 200)
    except OSError:
        return False


def measure(
    plane: controlplane.ControlPlane,
    name: str,
    argv: list[str],
    ready_url: str,
    ca_file: str | None,
    env: Mapping[str, str],
    probe: tuple[int, bytes] | None,
) -> dict[str, Any]:
    t0 = time.monotonic()
    process = plane.spawn(name, argv, env={"PYTHONUNBUFFERED": "1", **env})
    prober = Prober(probe[0], plane.ca_file, probe[1], t0) if probe else None
    if prober:
        prober.start()
    ready_at: float | None = None
    peak = 0
    try:
        while True:
            if process.popen.poll() is not None:
                raise RuntimeError(f"{name} exited with status {process.popen.returncode}:\n{process.tail()}")
            now = time.monotonic() - t0
            rss, hwm = memory_kib(process.popen.pid)
            peak = max(peak, hwm)
            if ready_at is None and ready(ready_url, ca_file):
                ready_at = now
            if ready_at is not None and now >= ready_at + SETTLE_SECONDS:
                break
            if now > START_TIMEOUT:
                raise RuntimeError(f"{name} not ready after {START_TIMEOUT:.0f} s:\n{process.tail()}")
            time.sleep(SAMPLE_SECONDS)
        settled = rss
    finally:
        if prober:
            prober.stop.set()
            prober.join(15)
        plane.stop_process(process)
    result: dict[str, Any] = {
        "ready_s": round(ready_at, 1),
        "peak_rss_mib": round(peak / 1024),
        "settled_rss_mib": round(settled / 1024),
    }
    if prober:
        latencies = [latency for _, latency in prober.answers if latency is not None]
        result |= {
            "admissions": len(prober.answers),
            "unanswered": sum(1 for _, latency in prober.answers if latency is None),
            "slowest_admission_s": round(max(latencies, default=float("nan")), 3),
            "slowest_before_ready_s": round(
                max((lat for t, lat in prober.answers if lat is not None and t < ready_at), default=0.0), 3
            ),
            "first_answer_s": round(prober.first or float("nan"), 1),
        }
    return result


def measure_all(
    plane: controlplane.ControlPlane, settings: config.Config, work: pathlib.Path, pythonpath: str | None
) -> dict[str, Any]:
    env = {"PYTHONPATH": pythonpath} if pythonpath else {}
    tag = "baseline" if pythonpath else "current"
    results: dict[str, Any] = {}
    # the webhook, as the replay starts it (its own certificate), with the chart's configuration
    directory = work / f"webhook-{tag}"
    kube_components.webhook_files(plane, directory, {"version": "v1"})
    port = controlplane.free_port()
    # -P: not the working directory's gpuslice but PYTHONPATH's, for --baseline
    argv = kube_components.webhook_argv(directory, port, str(plane.admin_kubeconfig), python_flags=["-P"])
    results["webhook"] = measure(
        plane,
        f"webhook-{tag}",
        argv,
        f"https://127.0.0.1:{port}/readyz",
        plane.ca_file,
        env,
        (port, probe_body(settings)),
    )
    print(f"  {tag} webhook: {results['webhook']}", file=sys.stderr, flush=True)
    for pacing in (False, True):
        config_file = work / f"controller-{tag}-{pacing}.yaml"
        config_file.write_text(yaml.safe_dump({"version": "v1", "pacing": {"enabled": pacing}}))
        port = controlplane.free_port()
        argv = kube_components.controller_argv(
            config_file, port, str(plane.admin_kubeconfig), identity="bench", python_flags=["-P"]
        )
        what = "controller (pacing)" if pacing else "controller"
        results[what] = measure(
            plane, f"controller-{tag}-{pacing}", argv, f"http://127.0.0.1:{port}/readyz", None, env, None
        )
        print(f"  {tag} {what}: {results[what]}", file=sys.stderr, flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=100000)
    parser.add_argument("--pending", type=int, default=60000, help="of --pods, pending (the rest bound and Running)")
    parser.add_argument("--baseline", metavar="DIR", help="source tree of an earlier gpuslice to measure beside")
    parser.add_argument("--repeats", type=int, default=3, help="starts of each component (and tree), alternated")
    parser.add_argument(
        "--lists-only",
        type=int,
        metavar="ROUNDS",
        help="measure only the API server's cost of the pacer's list, as JSON and as protobuf, ROUNDS times",
    )
    args = parser.parse_args()
    if not 0 <= args.pending <= args.pods:
        parser.error("--pending must be between 0 and --pods")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    binaries = controlplane.find_binaries()
    if binaries is None:
        print("bench_scale: no Kubernetes binaries (GPUSLICE_K8S_BIN; make k8s)", file=sys.stderr)
        return 2
    settings = config.Config()
    with (
        tempfile.TemporaryDirectory(prefix="gpuslice-scale-") as tmp,
        controlplane.ControlPlane(binaries, tmp) as plane,
    ):
        plane.start(scheduler=False, controllers=False)
        print(f"growing to {args.nodes} nodes, {args.pods} pods ({args.pending} pending)", file=sys.stderr, flush=True)
        growth = asyncio.run(grow(plane, settings, args.nodes, args.pods, args.pending))
        apiserver = next(p for p in plane.processes if p.name == "kube-apiserver")
        report: dict[str, Any] = {
            "nodes": args.nodes,
            "pods": args.pods,
            "pending": args.pending,
            "grow_s": {k: round(v) for k, v in growth.items()},
            "apiserver_rss_mib": round(memory_kib(apiserver.popen.pid)[0] / 1024),
        }
        if args.lists_only:
            report["lists"] = list_costs(plane, args.lists_only)
            print(json.dumps(report, indent=2))
            return 0
        work = pathlib.Path(tmp)
        trees = [("current", None)] + ([("baseline", os.path.abspath(args.baseline))] if args.baseline else [])
        runs: dict[str, list[dict[str, Any]]] = {tag: [] for tag, _ in trees}
        for _ in range(args.repeats):  # current, baseline, current, baseline...: the same load on both
            for tag, tree in trees:
                runs[tag].append(measure_all(plane, settings, work, tree))
        for tag, measured in runs.items():
            report[tag] = {
                component: {
                    figure: statistics.median(run[component][figure] for run in measured)
                    for figure in measured[0][component]
                }
                for component in measured[0]
            }
        report["runs"] = runs
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
