"""Server CPU per admission: the real webhook beside a no-op aiohttp handler, over loopback HTTPS.

    .venv/bin/python benchmarks/bench_webhook.py [--repeats 7] [--requests 2000] [--connections 8]
    .venv/bin/python benchmarks/bench_webhook.py --baseline DIR        # also an earlier tree's webhook, alternated
    .venv/bin/python benchmarks/bench_webhook.py --label-churn 100      # node labels changing meanwhile, per second
    .venv/bin/python benchmarks/bench_webhook.py --in-process 2000      # admission.review alone, per pod kind
    .venv/bin/python benchmarks/bench_webhook.py --in-process 2000 --dra  # the same in DRA mode, bare pods
    .venv/bin/python benchmarks/bench_webhook.py --profile gpu-fraction  # cProfile of admission.review
    .venv/bin/python benchmarks/bench_webhook.py --split 2000            # admission.review's steps, timed apart

Two server processes serve the same certificate with the same TLS context (certs.server_context):
the webhook as gpuslice-webhook builds it (server.make_app, served by server.start: the bounded
HTTPS site with its connection limits; gc.freeze() after start-up) over a node view of 300 GPU
nodes labelled as the device plugin labels them, in the proportions of the Alibaba trace's GPU
models (four GPU classes, partly allocated, CPU and memory headroom published); and a no-op
aiohttp handler that reads the body, parses it with the same JSON library and answers allowed
with the request's uid (the least any correct webhook does). A client process (aiohttp, N
keep-alive connections, TLS handshakes done before measuring) posts the same AdmissionReviews to
one server at a time; the server's user + system CPU time is read from /proc/<pid>/stat just
before and after, so wall-clock noise from other work on the machine does not enter. Three pod
kinds, each a set of Deployment-style pods of 5-20 KB: gpu-fraction (KAI's nvidia.com/gpu
placeholder), gpu-memory, and a CPU-only pod (no annotations, no device: the cpu-pods steering
path). Runs alternate webhook, no-op, webhook, no-op... for every pod kind; the summary gives the
median CPU per admission of each and the ratio of the medians. With two or more cores the
servers run on core 0 and the client on core 1. `--label-churn N`: in the webhook servers, N
node label changes a second (free capacity and headroom of a random node, as the node watch
applies them while pods come and go), so answers remembered across changes are measured too.
`--baseline DIR` adds a third server, the webhook of another source tree
(`git archive <commit> | tar -x -C DIR`; its gpuslice package is imported from there),
alternated with the other two: before and after a change in the same run.
Figures go in docs/benchmarks.md ("Webhook admission").
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
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
POD_KINDS = ("gpu-fraction", "gpu-memory", "cpu-only")
SERVERS = ("webhook", "noop", "baseline")

# (GPU model, GPUs per node, share of nodes in %): the Alibaba trace's GPU nodes, rounded.
NODE_MIX = (
    ("G2", 8, 45),
    ("T4", 2, 32),
    ("P100", 2, 11),
    ("G3", 8, 3),
    ("V100M16", 4, 3),
    ("V100M32", 8, 2),
    ("T4", 4, 2),
    ("A10", 1, 1),
    ("V100M16", 1, 1),
)
NODES = 300


# --- the workload ---------------------------------------------------------------------------


def make_pod(rng: random.Random, index: int, kind: str, *, unique: bool = False) -> dict[str, Any]:
    """A Deployment-created pod of 5-20 KB: env, volumes, probes, labels, annotations; `unique`:
    its CPU and memory requests its own too, so that no other pod has the fields the webhook reads."""
    annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": "9090", "team": "ml-platform"}
    limits: dict[str, str] = {"memory": "16Gi"}
    if kind == "gpu-fraction":
        annotations["gpu-fraction"] = rng.choice(["0.1", "0.25", "0.5", "0.75"])
        limits["nvidia.com/gpu"] = "1"  # KAI's placeholder
    elif kind == "gpu-memory":
        annotations["gpu-memory"] = rng.choice(["2000", "8Gi", "20000"])
        limits["nvidia.com/gpu"] = "1"
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
                    "resources": {"requests": _requests(rng, unique), "limits": limits},
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


def _requests(rng: random.Random, unique: bool) -> dict[str, str]:
    if not unique:
        return {"cpu": "4", "memory": "16Gi"}
    # Drawn (each run has its own seed), so no run meets another run's pods in the server's memory.
    return {"cpu": f"{rng.randrange(1000, 64000)}m", "memory": f"{rng.randrange(4096, 262144)}Mi"}


REPLICAS = 20  # pods per Deployment in the "replicas" arrival
ARRIVALS = ("replicas", "distinct", "unique")


def make_reviews(kind: str, count: int, arrival: str, *, seed: int = 42) -> list[bytes]:
    """`count` AdmissionReviews, each with its own uid (kube-apiserver's request uid is unique).
    `replicas`: Deployments of REPLICAS pods in turn, a Deployment's pods the same object (a
    generated name is chosen after admission), as a ReplicaSet's burst arrives; `distinct`: every
    pod's body different (one-pod Jobs, bare pods from a few templates: env, volumes, names
    differ, the fields the webhook reads come in a few variants), so no body repeats; `unique`:
    as `distinct`, and every pod's CPU and memory requests its own, so that no answer repeats."""
    rng = random.Random(seed)
    reviews, pod = [], None
    for index in range(count):
        if arrival != "replicas" or index % REPLICAS == 0:
            pod = make_pod(rng, index if arrival != "replicas" else index // REPLICAS, kind, unique=arrival == "unique")
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": f"{seed:08d}-0000-4000-8000-{index:012d}",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "team-a",
                "operation": "CREATE",
                "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
                "object": pod,
                "dryRun": False,
            },
        }
        reviews.append(json.dumps(review, separators=(",", ":")).encode())  # compact, as Go writes it
    return reviews


def cluster_view(settings: Any) -> Any:
    """NODES GPU nodes in NODE_MIX's proportions, labelled by the device plugin's own label
    function: 60 % of GPUs partly or fully allocated, CPU and memory headroom published."""
    from gpuslice.webhook import cluster

    view = cluster.ClusterView(settings.contract, default_gpu_memory_mib=settings.default_gpu_memory_mib)
    for name, labels in node_labels(settings, random.Random(7), range(NODES)):
        view.update_node(name, labels)
    return view


def node_labels(settings: Any, rng: random.Random, indexes: Any) -> list[tuple[str, dict[str, str]]]:
    """(name, labels) of the nodes at `indexes` of the view, each with an allocation and CPU and
    memory headroom drawn from `rng`: the same node always has the same GPUs."""
    from gpuslice.node import labels
    from gpuslice.sim import trace

    contract = settings.contract
    mix = [(model, gpus) for model, gpus, percent in NODE_MIX for _ in range(percent)]
    named = []
    for i in indexes:
        model, gpus = mix[i % len(mix)]
        name = f"node-{i:04d}"
        node = trace.node_inventory(trace.TraceNode(name, 96000, 393216, gpus, model))
        allocated = {
            g.uuid: rng.randint(0, contract.units_per_gpu(g.memory_mib)) if rng.random() < 0.6 else 0 for g in node.gpus
        }
        headroom = (rng.randint(0, 96000), rng.randint(0, 393216))
        named.append((name, labels.node_labels(node, contract, allocated=allocated, headroom=headroom)))
    return named


async def _churn(view: Any, settings: Any, rate: float) -> None:
    """`rate` label changes a second, as the node watch applies them when pods come and go: each
    a node's free capacity and headroom drawn anew (its GPUs stay). Labels are made beforehand: a
    real webhook's watch pays for decoding the event, not for the device plugin's label function."""
    rng = random.Random(11)
    changes = node_labels(settings, rng, [rng.randrange(NODES) for _ in range(500)])
    for step in itertools.count():
        await asyncio.sleep(1 / rate)
        view.update_node(*changes[step % len(changes)])


# --- in-process figures ----------------------------------------------------------------------


def in_process(count: int, dra: bool = False) -> None:
    """CPU time of the server's review step alone (repeats.RepeatAnswers.review: decode, check,
    mutate, encode, answers remembered) per AdmissionReview: no TLS, no HTTP, no server; beside it,
    orjson.loads alone (what the no-op handler does). Fresh view and memory for every pass. `dra`:
    in DRA mode, the pods bare (no owner), so that a fraction lists its fallback classes."""
    import orjson

    from gpuslice import config
    from gpuslice.webhook import repeats

    settings = config.load(overrides={"dra.enabled": True}, environ={}) if dra else config.Config()
    for kind in POD_KINDS:
        for arrival in ARRIVALS:
            reviews = make_reviews(kind, count, arrival)
            if dra:
                reviews = [_without_owner(body) for body in reviews]
            samples, floor = [], []
            for _ in range(5):
                view, answers = cluster_view(settings), repeats.RepeatAnswers()
                gc.freeze()
                started = time.process_time()
                for body in reviews:
                    answers.review(body, settings=settings, cluster=view)
                samples.append((time.process_time() - started) / count * 1e6)
                started = time.process_time()
                for body in reviews:
                    orjson.loads(body)
                floor.append((time.process_time() - started) / count * 1e6)
            print(
                f"{kind:<13} {arrival:<9} review: median {statistics.median(samples):6.1f} us, "
                f"best {min(samples):6.1f} us ({answers.repeats} of {count} from memory); "
                f"orjson.loads alone: median {statistics.median(floor):5.1f} us"
            )


def _without_owner(body: bytes) -> bytes:
    review = json.loads(body)
    del review["request"]["object"]["metadata"]["ownerReferences"]
    return json.dumps(review).encode()


def split(count: int) -> None:
    """CPU time of each step of a review of a pod that never repeats, timed apart in process
    (median of 5 passes over `count` distinct pods per kind, after one pass to warm the memos).
    The steps overlap (mutate holds the ones above it); `repeats.review` is the whole server step."""

    def timed(step: Any, items: list[Any]) -> float:
        for item in items:
            step(item)
        samples = []
        for _ in range(5):
            started = time.process_time()
            for item in items:
                step(item)
            samples.append((time.process_time() - started) / len(items) * 1e6)
        return statistics.median(samples)

    for kind in POD_KINDS:
        _split_kind(kind, count, timed)


def _split_kind(kind: str, count: int, timed: Any) -> None:
    import base64
    import copy

    import orjson

    from gpuslice import config
    from gpuslice.webhook import admission, cpupods, decoding, mutation, patches, repeats, shape, shares, tolerations
    from gpuslice.webhook import annotations as annotations_

    settings = config.Config()
    rules = cpupods.key_rules(settings.contract)
    bodies = make_reviews(kind, count, "unique")
    view = cluster_view(settings)
    gc.freeze()
    documents = [orjson.loads(body) for body in bodies]
    pods = [document["request"]["object"] for document in documents]
    steps = {
        "orjson.loads": timed(orjson.loads, bodies),
        "decoding.fields (typed pass, key)": timed(lambda b: decoding.fields(b, rules=rules), bodies),
        "Decoded.document (the fields read)": timed(
            lambda d: d.document(), [decoding.fields(b, rules=rules) for b in bodies]
        ),
        "request checks": timed(lambda d: admission._check_request(d["request"]), documents),
        "shape.check_pod": timed(shape.check_pod, pods),
    }
    if kind == "cpu-only":
        steps["cpupods.patch"] = timed(lambda p: cpupods.patch(p, settings, view), pods)
    else:
        contract = settings.contract
        read = [annotations_.read(p["spec"], p["metadata"]["annotations"], contract) for p in pods]
        if any(s is None for s in read):  # every pod of a GPU kind carries the annotations it was made with
            raise SystemExit(f"{kind}: a pod without GPU annotations")
        converted = [shares.convert(s, p["spec"], settings, view) for s, p in zip(read, pods, strict=True) if s]
        steps |= {
            "annotations.read": timed(
                lambda p: annotations_.read(p["spec"], p["metadata"]["annotations"], contract), pods
            ),
            "shares.convert (class choice)": timed(
                lambda a: shares.convert(a[0], a[1]["spec"], settings, view), list(zip(read, pods, strict=True))
            ),
            "tolerations": timed(lambda p: tolerations.patch_ops(p["spec"], settings.converted_pod_tolerations), pods),
            "steering terms": timed(lambda c: patches._steering_terms(c, settings), converted),
            "patches.build": timed(
                lambda a: patches.build(a[1], copy.copy(a[0]), settings, pacer_absent=""),
                list(zip(converted, pods, strict=True)),
            ),
        }
    outcomes = [mutation.mutate(p, settings=settings, cluster=view) for p in pods]
    steps |= {
        "mutation.mutate": timed(lambda p: mutation.mutate(p, settings=settings, cluster=view), pods),
        "encode the answer": timed(
            lambda o: orjson.dumps(
                admission._answer(
                    "u", True, patchType="JSONPatch", patch=base64.b64encode(orjson.dumps(o.patch)).decode()
                )
            ),
            outcomes,
        ),
        "admission.review (decoded)": timed(lambda d: admission.review(d, settings=settings, cluster=view), documents),
        "admission.review (bytes)": timed(lambda b: admission.review(b, settings=settings, cluster=view), bodies),
    }
    firsts = []  # a fresh memory for each pass: every body is a first sighting
    for _ in range(5):
        answers = repeats.RepeatAnswers()
        started = time.process_time()
        for body in bodies:
            answers.review(body, settings=settings, cluster=view)
        firsts.append((time.process_time() - started) / len(bodies) * 1e6)
    steps["repeats.review (first sightings)"] = statistics.median(firsts)
    print(f"{kind}:")
    for name, us in steps.items():
        print(f"  {name:<34} {us:6.1f} us")
    gc.unfreeze()


def profile(kind: str, count: int = 4000) -> None:
    import cProfile
    import pstats

    from gpuslice import config
    from gpuslice.webhook import repeats

    settings = config.Config()
    view, answers = cluster_view(settings), repeats.RepeatAnswers()
    for body in make_reviews(kind, 200, "unique", seed=7):
        answers.review(body, settings=settings, cluster=view)
    reviews = make_reviews(kind, count, "unique")
    profiler = cProfile.Profile()
    profiler.enable()
    for body in reviews:
        answers.review(body, settings=settings, cluster=view)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


# --- servers ---------------------------------------------------------------------------------


async def _serve_webhook(port: int, context: ssl.SSLContext, churn: float) -> None:
    from gpuslice import config
    from gpuslice.webhook import server

    settings = config.Config()
    view = cluster_view(settings)
    app = server.make_app(settings, view)
    gc.freeze()  # as gpuslice-webhook's main does
    runner = await server.start(app, context, host="127.0.0.1", port=port)
    changing = asyncio.create_task(_churn(view, settings, churn)) if churn > 0 else None
    try:
        await asyncio.Event().wait()
    finally:
        if changing is not None:
            changing.cancel()
        await runner.cleanup()


async def _serve_noop(port: int, context: ssl.SSLContext) -> None:
    import orjson  # the webhook's JSON library: the comparison measures the handler, not the parser
    from aiohttp import web

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
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=context).start()
    gc.freeze()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def run_server(kind: str, port: int, cert: str, key: str, churn: float) -> None:
    from gpuslice.webhook import certs

    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {0})
    context = certs.server_context(cert, key)
    asyncio.run(_serve_noop(port, context) if kind == "noop" else _serve_webhook(port, context, churn))


# --- client ----------------------------------------------------------------------------------


async def _drive(port: int, ca_file: str, kind: str, arrival: str, requests: int, connections: int, seed: int) -> None:
    """Open `connections` keep-alive connections, say "ready", wait for "go" on stdin, post
    `requests` reviews of `kind` arriving as `arrival`, in order, spread over the connections;
    print the result as JSON. An answer that is not 200, not allowed or not for the request's uid
    counts as an error."""
    import aiohttp

    warm_up = make_reviews(kind, 5 * connections, "distinct", seed=7)  # other pods than those measured
    reviews = make_reviews(kind, requests, arrival, seed=seed)  # new pods and uids for every run
    context = ssl.create_default_context(cafile=ca_file)
    connector = aiohttp.TCPConnector(ssl=context, limit=connections)
    url = f"https://127.0.0.1:{port}/mutate"
    headers = {"Content-Type": "application/json"}
    errors = 0
    async with aiohttp.ClientSession(connector=connector) as session:

        async def send(body: bytes) -> None:
            nonlocal errors
            uid = body[body.index(b'"uid":"') : body.index(b'"', body.index(b'"uid":"') + 7) + 1]
            async with session.post(url, data=body, headers=headers, server_hostname=SERVICE_DNS) as response:
                answer = await response.read()
                if response.status != 200 or b'"allowed":true' not in answer or uid not in answer:
                    errors += 1

        async def worker(bodies: list[bytes]) -> None:
            for body in bodies:
                await send(body)

        # Warm-up: every connection's TLS handshake, and the server's first requests, unmeasured.
        await asyncio.gather(*(worker(warm_up[n::connections]) for n in range(connections)))
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        started = time.perf_counter()
        await asyncio.gather(*(worker(reviews[n::connections]) for n in range(connections)))
        elapsed = time.perf_counter() - started
        print(json.dumps({"requests": requests, "errors": errors, "seconds": elapsed}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # closed after the reading


def run_client(port: int, ca_file: str, kind: str, arrival: str, requests: int, connections: int, seed: int) -> None:
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {1})
    asyncio.run(_drive(port, ca_file, kind, arrival, requests, connections, seed))


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc/<pid>/stat."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- orchestration ---------------------------------------------------------------------------


def _wait_ready(port: int, ca_file: str) -> None:
    import urllib.error
    import urllib.request

    context = ssl.create_default_context(cafile=ca_file)
    context.check_hostname = False
    deadline = time.monotonic() + 60
    while True:
        try:
            request = urllib.request.Request(
                f"https://127.0.0.1:{port}/mutate", data=make_reviews("cpu-only", 1, "distinct", seed=1)[0]
            )
            urllib.request.urlopen(request, context=context, timeout=2)
            return
        except urllib.error.HTTPError:
            return  # it answered: it is up
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"server on port {port} did not start") from None
            time.sleep(0.2)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _measure(
    script: str, server: subprocess.Popen[bytes], port: int, ca_file: str, kind: str, arrival: str, seed: int, args: Any
) -> float:
    """Server CPU µs per admission for one client run."""
    client = subprocess.Popen(
        [
            *(sys.executable, script, "--role", "client", "--port", str(port), "--ca", ca_file),
            *("--pods", kind, "--arrival", arrival, "--requests", str(args.requests), "--seed", str(seed)),
            *("--connections", str(args.connections)),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert client.stdin is not None and client.stdout is not None
    try:
        if client.stdout.readline().strip() != "ready":
            raise SystemExit("client did not start")
        before = _cpu_seconds(server.pid)
        client.stdin.write("go\n")
        client.stdin.flush()
        result = json.loads(client.stdout.readline())
        after = _cpu_seconds(server.pid)
        client.stdin.write("done\n")
        client.stdin.flush()
    finally:
        client.wait(timeout=60)
    if result["errors"]:
        raise SystemExit(f"{result['errors']} of {result['requests']} admissions failed")
    return (after - before) / result["requests"] * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7, help="alternated webhook / no-op pairs per pod kind")
    parser.add_argument("--requests", type=int, default=2000, help="admissions per measured run")
    parser.add_argument("--connections", type=int, default=8, help="keep-alive connections of the client")
    parser.add_argument("--baseline", metavar="DIR", help="source tree of an earlier webhook to alternate with")
    parser.add_argument("--pods", default="gpu-fraction", choices=POD_KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--arrival", default="replicas", choices=ARRIVALS, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=42, help=argparse.SUPPRESS)
    parser.add_argument(
        "--arrivals",
        default=",".join(ARRIVALS),
        help=f"arrivals to measure, comma-separated (default: {', '.join(ARRIVALS)})",
    )
    parser.add_argument(
        "--label-churn",
        type=float,
        default=0.0,
        metavar="PER_S",
        help="node label changes a second in the webhook servers' views (free capacity only; default 0: a still view)",
    )
    parser.add_argument("--in-process", type=int, default=0, metavar="N", help="only time admission.review, N per kind")
    parser.add_argument("--dra", action="store_true", help="with --in-process: DRA mode, bare pods")
    parser.add_argument("--profile", choices=POD_KINDS, help="only cProfile admission.review on this pod kind")
    parser.add_argument(
        "--split", type=int, default=0, metavar="N", help="only time the review's steps, N pods per kind"
    )
    parser.add_argument("--role", choices=["main", "server", "client"], default="main", help=argparse.SUPPRESS)
    parser.add_argument("--kind", default="webhook", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--cert", help=argparse.SUPPRESS)
    parser.add_argument("--key", help=argparse.SUPPRESS)
    parser.add_argument("--ca", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.in_process:
        in_process(args.in_process, args.dra)
        return
    if args.profile:
        profile(args.profile)
        return
    if args.split:
        split(args.split)
        return
    if args.role == "server":
        run_server(args.kind, args.port, args.cert, args.key, args.label_churn)
        return
    if args.role == "client":
        run_client(args.port, args.ca, args.pods, args.arrival, args.requests, args.connections, args.seed)
        return

    import trustme

    for kind in POD_KINDS:
        sizes = [len(r) for r in make_reviews(kind, 200, "distinct")]
        print(f"{kind}: AdmissionReviews of {min(sizes) / 1024:.1f}-{max(sizes) / 1024:.1f} KB", end="; ")
    print(f"cores: {os.cpu_count()}; load average at start: {os.getloadavg()[0]:.2f}")
    script = str(pathlib.Path(__file__).resolve())
    results: dict[tuple[str, str, str], list[float]] = {}
    arrivals = [a.strip() for a in args.arrivals.split(",") if a.strip()]
    if not arrivals or set(arrivals) - set(ARRIVALS):
        raise SystemExit(f"--arrivals: choose from {', '.join(ARRIVALS)}")
    cases = [(pods, arrival) for pods in POD_KINDS for arrival in arrivals]
    with tempfile.TemporaryDirectory() as tmp:
        ca = trustme.CA()
        leaf = ca.issue_cert(SERVICE_DNS)
        cert, key, ca_file = f"{tmp}/tls.crt", f"{tmp}/tls.key", f"{tmp}/ca.crt"
        leaf.cert_chain_pems[0].write_to_path(cert)
        leaf.private_key_pem.write_to_path(key)
        ca.cert_pem.write_to_path(ca_file)
        kinds = [kind for kind in SERVERS if kind != "baseline" or args.baseline]
        ports = {kind: _free_port() for kind in kinds}
        servers = {
            kind: subprocess.Popen(
                [sys.executable, script, "--role", "server", "--kind", kind, "--port", str(port)]
                + ["--cert", cert, "--key", key, "--label-churn", str(args.label_churn)],
                env={**os.environ, "PYTHONPATH": args.baseline} if kind == "baseline" else None,
            )
            for kind, port in ports.items()
        }
        try:
            for port in ports.values():
                _wait_ready(port, ca_file)
            for repeat in range(args.repeats):
                for pods, arrival in cases:
                    for kind in kinds:  # alternated: webhook, no-op, [baseline,] webhook, no-op, ...
                        seed = 1000 + repeat  # the servers of one repeat see the same pods, never seen before
                        cpu_us = _measure(script, servers[kind], ports[kind], ca_file, pods, arrival, seed, args)
                        results.setdefault((kind, pods, arrival), []).append(cpu_us)
                        print(
                            f"repeat {repeat + 1} {pods:<13} {arrival:<9} {kind:<8} "
                            f"server CPU {cpu_us:6.1f} us/admission",
                            flush=True,
                        )
        finally:
            for process in servers.values():
                process.terminate()
                process.wait(timeout=10)

    print(
        f"\nmedians of {args.repeats} alternated runs, {args.requests} admissions each over "
        f"{args.connections} keep-alive connections; label changes: {args.label_churn:g}/s; "
        f"load average at end: {os.getloadavg()[0]:.2f}"
    )
    compared = [kind for kind in kinds if kind != "noop"]
    # Each run's webhook, no-op and baseline ran one after the other: the median of the per-run
    # ratios cancels load that drifts between runs (the machine may be shared).
    print(
        "| pod | arrival | no-op µs CPU / admission | "
        + " | ".join(
            f"{kind} µs CPU / admission | {kind} / no-op: ratio of medians (runs) | "
            f"{kind} / no-op: median of per-run ratios"
            for kind in compared
        )
        + (" | webhook / baseline: median of per-run ratios |" if "baseline" in compared else " |")
    )
    print("|---|---|---|" + "---|---|---|" * len(compared) + ("---|" if "baseline" in compared else ""))
    for pods, arrival in cases:
        noop = results[("noop", pods, arrival)]
        cells = [f"{statistics.median(noop):.0f}"]
        for kind in compared:
            cpu = results[(kind, pods, arrival)]
            pairs = [w / n for w, n in zip(cpu, noop, strict=True)]
            ratio = statistics.median(cpu) / statistics.median(noop)
            cells += [
                f"{statistics.median(cpu):.0f}",
                f"**{ratio:.2f}** ({min(pairs):.2f}-{max(pairs):.2f})",
                f"{statistics.median(pairs):.2f}",
            ]
        if "baseline" in compared:
            versus = [
                w / b
                for w, b in zip(results[("webhook", pods, arrival)], results[("baseline", pods, arrival)], strict=True)
            ]
            cells.append(f"{statistics.median(versus):.2f} ({min(versus):.2f}-{max(versus):.2f})")
        print(f"| {pods} | {arrival} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
