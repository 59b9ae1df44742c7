"""Webhook admission throughput and latency over loopback HTTPS, beside a no-op aiohttp handler.

    .venv/bin/python benchmarks/bench_webhook.py [--runs 5] [--seconds 3] [--concurrency 1 50 200] [--rate 200]

Two server processes (the real webhook app, and a no-op app that only parses the review and
echoes its uid, the least any correct webhook must do, with the same JSON library) serve the
same certificate; a separate
load-generator process (aiohttp client, N keep-alive connections) posts the same set of
AdmissionReviews (Deployment-style pods of 5-20 KB: half gpu-fraction, a quarter gpu-memory, a
quarter without annotations) to one server at a time. With two or more cores the servers are
pinned to core 0 and the load generator to core 1. Each run measures every concurrency level
on both servers back to back; the summary gives medians over runs and the webhook / no-op ratio.
Figures go in docs/benchmarks.md ("Webhook admission").
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import pathlib
import random
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

SERVICE_DNS = "gpuslice-webhook.gpuslice.svc"


# --- the workload ---------------------------------------------------------------------------


def make_pod(rng: random.Random, index: int) -> dict[str, Any]:
    """A Deployment-created pod of 5-20 KB: env, volumes, probes, labels, annotations."""
    annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": "9090", "team": "ml-platform"}
    kind = index % 4
    if kind in (0, 1):
        annotations["gpu-fraction"] = rng.choice(["0.1", "0.25", "0.5", "0.75"])
    elif kind == 2:
        annotations["gpu-memory"] = rng.choice(["2000", "8Gi", "20000"])
    env = [{"name": f"SETTING_{i}", "value": "x" * rng.randint(20, 120)} for i in range(rng.randint(30, 160))]
    volumes = [{"name": f"data-{i}", "configMap": {"name": f"cm-{i}"}} for i in range(rng.randint(2, 10))]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"trainer-{index % 7}-7c9f8d6b5-",
            "namespace": "team-a",
            "labels": {"app": "trainer", "pod-template-hash": "7c9f8d6b5", "kai.scheduler/queue": "research"},
            "annotations": annotations,
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
                    "env": env,
                    "resources": {
                        "requests": {"cpu": "4", "memory": "16Gi"},
                        "limits": {"memory": "16Gi", "nvidia.com/gpu": "1"},
                    },
                    "volumeMounts": [{"name": v["name"], "mountPath": f"/etc/{v['name']}"} for v in volumes],
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 5},
                },
                {
                    "name": "log-shipper",
                    "image": "registry.example/fluent-bit:3.0",
                    "resources": {"limits": {"cpu": "100m"}},
                },
            ],
            "volumes": volumes,
            "restartPolicy": "Always",
            "schedulerName": "default-scheduler",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }


def make_reviews(count: int = 200) -> list[bytes]:
    rng = random.Random(42)
    reviews = []
    for index in range(count):
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": f"00000000-0000-0000-0000-{index:012d}",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "team-a",
                "operation": "CREATE",
                "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
                "object": make_pod(rng, index),
                "dryRun": False,
            },
        }
        reviews.append(json.dumps(review).encode())
    return reviews


# --- servers ---------------------------------------------------------------------------------


def cluster_view(settings: Any) -> Any:
    """A mixed 200-node cluster of three GPU classes, so class choice and pinning run for every pod."""
    from gpuslice.webhook import cluster

    view = cluster.ClusterView(settings.contract, default_gpu_memory_mib=settings.default_gpu_memory_mib)
    c = settings.contract
    for i in range(200):
        memory, gpus = ((81920, 8), (143771, 8), (24576, 4))[i % 3]
        view.update_node(
            f"node-{i}",
            {
                c.label_gpu_product: f"GPU-{memory}",
                c.label_gpu_memory_mib: str(memory),
                c.label_gpu_count: str(gpus),
                c.label_free_units: str(i * 7 % (gpus * memory // 256)),
                c.label_free_block_units: "100",
                c.label_free_gpus: "1",
            },
        )
    return view


def in_process(passes: int) -> None:
    """CPU time of admission.review alone (decode, mutate, encode) per AdmissionReview: no TLS, no
    HTTP, so it isolates the webhook's own cost from a loaded machine's noise."""
    from gpuslice import config
    from gpuslice.webhook import admission

    settings = config.Config()
    view = cluster_view(settings)
    reviews = make_reviews()
    for body in reviews:  # warm-up
        admission.review(body, settings=settings, cluster=view)
    gc.freeze()
    samples = []
    for _ in range(passes):
        started = time.process_time()
        for body in reviews:
            admission.review(body, settings=settings, cluster=view)
        samples.append((time.process_time() - started) / len(reviews) * 1e6)
    print(
        f"admission.review CPU per AdmissionReview over {len(reviews)} reviews x {passes} passes: "
        f"median {statistics.median(samples):.1f} us, min {min(samples):.1f} us"
    )


def run_server(kind: str, port: int, cert: str, key: str) -> None:
    from aiohttp import web

    from gpuslice import config
    from gpuslice.webhook import certs, server

    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {0})
    context = certs.server_context(cert, key)
    if kind == "webhook":
        settings = config.Config()
        view = cluster_view(settings)
        app = server.make_app(settings, view)
    else:
        import orjson  # the webhook's JSON library: the comparison measures the handler, not the parser

        async def noop(request: web.Request) -> web.Response:
            review = orjson.loads(await request.read())
            answer = {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {"uid": review["request"]["uid"], "allowed": True},
            }
            return web.Response(body=orjson.dumps(answer), content_type="application/json")

        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_post("/mutate", noop)
    gc.freeze()  # as gpuslice-webhook's main does: start-up objects are never scanned by the GC
    web.run_app(app, host="127.0.0.1", port=port, ssl_context=context, access_log=None, print=None)


# --- load generator --------------------------------------------------------------------------


def _summary(latencies: list[float], elapsed: float, requests: int, errors: int) -> dict[str, float]:
    latencies.sort()
    return {
        "rps": len(latencies) / elapsed,
        "p50_ms": latencies[len(latencies) // 2] * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
        "requests": requests,  # including warm-up, for server CPU per request
        "errors": errors,
    }


async def _load(port: int, ca_file: str, concurrency: int, seconds: float, rate: float) -> dict[str, float]:
    """Closed loop (rate 0): `concurrency` connections each sending back to back, for throughput.
    Open loop (rate > 0): requests due at a fixed rate over up to `concurrency` connections, for
    latency as kube-apiserver sees it at that admission rate (measured from the due time)."""
    import aiohttp

    reviews = make_reviews()
    context = ssl.create_default_context(cafile=ca_file)
    connector = aiohttp.TCPConnector(ssl=context, limit=concurrency)
    latencies: list[float] = []
    errors = requests = 0
    url = f"https://127.0.0.1:{port}/mutate"
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector) as session:

        async def send(body: bytes) -> None:
            nonlocal errors, requests
            requests += 1
            async with session.post(url, data=body, headers=headers, server_hostname=SERVICE_DNS) as response:
                await response.read()
                if response.status != 200:
                    errors += 1

        async def worker(offset: int, stop_at: float, record: bool) -> None:
            i = offset
            while time.perf_counter() < stop_at:
                started = time.perf_counter()
                await send(reviews[i % len(reviews)])
                i += 1
                if record:
                    latencies.append(time.perf_counter() - started)

        # Warm-up: open every connection (TLS handshakes) before measuring.
        warm_until = time.perf_counter() + 0.5
        await asyncio.gather(*(worker(n * 17, warm_until, False) for n in range(concurrency)))
        if rate <= 0:
            started = time.perf_counter()
            await asyncio.gather(*(worker(n * 17, started + seconds, True) for n in range(concurrency)))
            return _summary(latencies, time.perf_counter() - started, requests, errors)

        async def due(index: int, at: float) -> None:
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            await send(reviews[index % len(reviews)])
            latencies.append(time.perf_counter() - at)

        started = time.perf_counter()
        count = int(rate * seconds)
        await asyncio.gather(*(due(i, started + i / rate) for i in range(count)))
        return _summary(latencies, seconds, requests, errors)


def run_client(port: int, ca_file: str, concurrency: int, seconds: float, rate: float) -> None:
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {1})
    print(json.dumps(asyncio.run(_load(port, ca_file, concurrency, seconds, rate))))


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc (0 where there is no /proc)."""
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- orchestration ---------------------------------------------------------------------------


def _wait_ready(port: int, ca_file: str) -> None:
    import urllib.request

    context = ssl.create_default_context(cafile=ca_file)
    context.check_hostname = False
    deadline = time.monotonic() + 30
    while True:
        try:
            request = urllib.request.Request(f"https://127.0.0.1:{port}/mutate", data=make_reviews(1)[0])
            urllib.request.urlopen(request, context=context, timeout=2)
            return
        except urllib.error.HTTPError:
            return  # it answered (400 or 500): it is up
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"server on port {port} did not start") from None
            time.sleep(0.1)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 50, 200], help="closed-loop connections")
    parser.add_argument("--rate", type=float, default=200.0, help="open-loop admissions per second (latency)")
    parser.add_argument("--open-connections", type=int, default=50, help="connections for the open-loop run")
    parser.add_argument(
        "--in-process", type=int, default=0, metavar="PASSES", help="only time admission.review in this process"
    )
    parser.add_argument("--role", choices=["main", "server", "client"], default="main", help=argparse.SUPPRESS)
    parser.add_argument("--kind", default="webhook", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--cert", help=argparse.SUPPRESS)
    parser.add_argument("--key", help=argparse.SUPPRESS)
    parser.add_argument("--ca", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.in_process:
        in_process(args.in_process)
        return
    if args.role == "server":
        run_server(args.kind, args.port, args.cert, args.key)
        return
    if args.role == "client":
        run_client(args.port, args.ca, args.concurrency[0], args.seconds, args.rate)
        return

    import trustme

    sizes = [len(r) for r in make_reviews()]
    print(
        f"AdmissionReview sizes: {min(sizes) / 1024:.1f}-{max(sizes) / 1024:.1f} KB, "
        f"median {statistics.median(sizes) / 1024:.1f} KB; cores: {os.cpu_count()}"
    )
    script = str(pathlib.Path(__file__).resolve())
    with tempfile.TemporaryDirectory() as tmp:
        ca = trustme.CA()
        leaf = ca.issue_cert(SERVICE_DNS)
        cert, key, ca_file = f"{tmp}/tls.crt", f"{tmp}/tls.key", f"{tmp}/ca.crt"
        leaf.cert_chain_pems[0].write_to_path(cert)
        leaf.private_key_pem.write_to_path(key)
        ca.cert_pem.write_to_path(ca_file)
        ports = {"webhook": _free_port(), "noop": _free_port()}
        servers = [
            subprocess.Popen(
                [
                    sys.executable,
                    script,
                    "--role",
                    "server",
                    "--kind",
                    kind,
                    "--port",
                    str(port),
                    "--cert",
                    cert,
                    "--key",
                    key,
                ]
            )
            for kind, port in ports.items()
        ]
        try:
            for port in ports.values():
                _wait_ready(port, ca_file)
            results: dict[tuple[str, str], list[dict[str, float]]] = {}
            modes = [(f"c={c}", c, 0.0) for c in args.concurrency] + [
                (f"{args.rate:g}/s over {args.open_connections}", args.open_connections, args.rate)
            ]
            for run in range(args.runs):
                for label, concurrency, rate in modes:
                    for (kind, port), process in zip(ports.items(), servers, strict=True):
                        cpu_before = _cpu_seconds(process.pid)
                        output = subprocess.run(
                            [
                                *(sys.executable, script, "--role", "client", "--port", str(port), "--ca", ca_file),
                                *("--concurrency", str(concurrency), "--seconds", str(args.seconds)),
                                *("--rate", str(rate)),
                            ],
                            check=True,
                            capture_output=True,
                            text=True,
                        ).stdout
                        measured = json.loads(output)
                        measured["cpu_us"] = (_cpu_seconds(process.pid) - cpu_before) / measured["requests"] * 1e6
                        results.setdefault((kind, label), []).append(measured)
                        print(
                            f"run {run + 1} {label:<14} {kind:<7} {measured['rps']:8.0f}/s "
                            f"p50 {measured['p50_ms']:6.2f} ms p99 {measured['p99_ms']:6.2f} ms "
                            f"server CPU {measured['cpu_us']:5.0f} us/adm errors {measured['errors']}",
                            flush=True,
                        )
        finally:
            for process in servers:
                process.terminate()
                process.wait(timeout=10)

    print(f"\nmedians of {args.runs} runs, {args.seconds:g} s each:")
    print(
        "| load | webhook adm/s | no-op adm/s | ratio | webhook p50 / p99 ms | no-op p50 / p99 ms "
        "| server CPU per admission, webhook / no-op |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, _, _ in modes:
        row = {}
        for kind in ports:
            runs = results[(kind, label)]
            row[kind] = {k: statistics.median(r[k] for r in runs) for k in ("rps", "p50_ms", "p99_ms", "cpu_us")}
        w, n = row["webhook"], row["noop"]
        print(
            f"| {label} | {w['rps']:.0f} | {n['rps']:.0f} | {w['rps'] / n['rps']:.2f} | "
            f"{w['p50_ms']:.2f} / {w['p99_ms']:.2f} | {n['p50_ms']:.2f} / {n['p99_ms']:.2f} | "
            f"{w['cpu_us']:.0f} / {n['cpu_us']:.0f} us |"
        )


if __name__ == "__main__":
    main()
