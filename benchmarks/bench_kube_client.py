"""The product's Kubernetes client (the official, blocking client in threads) against an asyncio one.

    GPUSLICE_K8S_BIN=$(cat .k8s-bin) .venv/bin/python benchmarks/bench_kube_client.py \
        [--pods 2000] [--repeats 5]

A real kube-apiserver and etcd (e2e/k8s) hold `--pods` pods as our webhook converts them
(bench_scale.converted_pod, 5.5 KB each as stored). The two clients then do the same work, in
alternation, `--repeats` times (medians reported):

- `official`: the `kubernetes` client the product uses (gpuslice/kubeclient.py), each call in
  `asyncio.to_thread` on the default executor, exactly as the controller, pacer, plugins and
  webhook call it;
- `aiohttp`: the simulator's asyncio client (sim/kube_api.py), one connection pool, no threads.

What each run measures:
- `read`: one pod read at a time, 300 times (the Lease reads and renewals, a requeue's read):
  median and 99th percentile of one call;
- `patch`: every pod patched once (a JSON patch of one annotation, as the pacer's release), 64 in
  flight at a time (a burst's releases): pods per second. The official client has as many in
  flight as the default executor has threads (min(32, CPUs + 4): 6 on two cores);
- `list`: every pod listed in pages of 500 (gpuslice/listwatch.py's) while a task ticks every 5 ms:
  how late the event loop ran at worst (what an admission waiting on that loop would wait) and the
  list's wall time. The official client decodes each page in its thread (as gpuslice/listwatch.py
  does); the asyncio client decodes it on the loop. A decoder holds the GIL for a whole page
  either way, so what bounds the loop's wait is the page, not the thread.

Figures go in docs/benchmarks.md ("The Kubernetes client"), and the decision they support in
docs/architecture.md.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import bench_scale  # benchmarks/ is the script's folder: the converted pod as stored
import kubernetes

from gpuslice import config, kubeclient
from gpuslice.sim import controlplane, kube_api

NAMESPACE = "bench"
IN_FLIGHT = 64
READS = 300
TICK_SECONDS = 0.005
PAGE = 500  # gpuslice/listwatch.py's page


def _pod_names(pods: int) -> list[str]:
    return [f"trainer-{i:06d}" for i in range(pods)]


async def _grow(api: kube_api.Api, settings: config.Config, pods: int) -> None:
    await api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    template = bench_scale.converted_pod(settings)

    async def create(name: str) -> None:
        manifest = copy.deepcopy(template)
        manifest["metadata"]["name"] = name
        await api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", manifest)

    await _bounded([lambda name=name: create(name) for name in _pod_names(pods)])


async def _bounded(jobs: list[Callable[[], Awaitable[Any]]]) -> None:
    """Run `jobs`, IN_FLIGHT at a time."""
    queue = list(reversed(jobs))

    async def worker() -> None:
        while queue:
            await queue.pop()()

    await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))


class Client:
    """The three workloads through one client."""

    name = ""

    async def read(self, name: str) -> None:
        raise NotImplementedError

    async def patch(self, name: str, value: str) -> None:
        raise NotImplementedError

    async def list(self) -> int:
        raise NotImplementedError


class Official(Client):
    name = "official"

    def __init__(self, kubeconfig: str) -> None:
        self.api = kubeclient.core_api_from_flag(kubeconfig)

    async def read(self, name: str) -> None:
        await asyncio.to_thread(self.api.read_namespaced_pod, name, NAMESPACE)

    async def patch(self, name: str, value: str) -> None:
        ops = [{"op": "add", "path": "/metadata/annotations/bench~1round", "value": value}]
        await asyncio.to_thread(self.api.patch_namespaced_pod, name, NAMESPACE, ops)

    async def list(self) -> int:
        def page(token: str) -> tuple[int, str]:  # decoded in the thread, as gpuslice/listwatch.py does
            response = self.api.list_namespaced_pod(NAMESPACE, limit=PAGE, _continue=token, _preload_content=False)
            listed = json.loads(response.data)
            return len(listed["items"]), listed["metadata"].get("continue") or ""

        count, token = await asyncio.to_thread(page, "")
        while token:
            more, token = await asyncio.to_thread(page, token)
            count += more
        return count


class Aiohttp(Client):
    name = "aiohttp"

    def __init__(self, api: kube_api.Api) -> None:
        self.api = api

    async def read(self, name: str) -> None:
        await self.api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")

    async def patch(self, name: str, value: str) -> None:
        ops = [{"op": "add", "path": "/metadata/annotations/bench~1round", "value": value}]
        await self.api.request(
            "PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}", ops, content_type="application/json-patch+json"
        )

    async def list(self) -> int:
        count, token = 0, None
        while token != "":
            params = {"limit": str(PAGE), **({"continue": token} if token else {})}
            listed = await self.api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods", params=params)
            count += len(listed["items"])
            token = listed["metadata"].get("continue") or ""
        return count


async def measure(client: Client, names: list[str], round_: int) -> dict[str, float]:
    latencies = []
    for name in names[:READS]:
        started = time.perf_counter()
        await client.read(name)
        latencies.append(time.perf_counter() - started)
    latencies.sort()

    started = time.perf_counter()
    await _bounded([lambda name=name: client.patch(name, f"{client.name}-{round_}") for name in names])
    patch_s = time.perf_counter() - started

    worst = 0.0
    listing = True

    async def ticker() -> None:
        nonlocal worst
        while listing:
            before = time.perf_counter()
            await asyncio.sleep(TICK_SECONDS)
            worst = max(worst, time.perf_counter() - before - TICK_SECONDS)

    ticking = asyncio.create_task(ticker())
    await asyncio.sleep(0.05)
    started = time.perf_counter()
    count = await client.list()
    list_s = time.perf_counter() - started
    listing = False
    await ticking
    if count != len(names):
        raise RuntimeError(f"{client.name} listed {count} pods of {len(names)}")
    return {
        "read_p50_ms": 1000 * latencies[len(latencies) // 2],
        "read_p99_ms": 1000 * latencies[int(len(latencies) * 0.99)],
        "patch_per_s": len(names) / patch_s,
        "list_s": list_s,
        "list_loop_late_ms": 1000 * worst,
    }


async def run(plane: controlplane.ControlPlane, pods: int, repeats: int) -> dict[str, list[dict[str, float]]]:
    settings = config.Config()
    names = _pod_names(pods)
    results: dict[str, list[dict[str, float]]] = {"official": [], "aiohttp": []}
    async with kube_api.Api(plane.server, plane.admin_token, plane.ca_file, connections=IN_FLIGHT) as api:
        await _grow(api, settings, pods)
        clients: list[Client] = [Official(plane.admin_kubeconfig), Aiohttp(api)]
        for round_ in range(repeats):
            for client in clients if round_ % 2 == 0 else reversed(clients):
                results[client.name].append(await measure(client, names, round_))
                print(client.name, round_, results[client.name][-1], file=sys.stderr, flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    binaries = controlplane.find_binaries()
    if binaries is None:
        print("bench_kube_client: no Kubernetes binaries (GPUSLICE_K8S_BIN; make k8s builds them)", file=sys.stderr)
        return 2
    kubernetes.client.Configuration.set_default(kubernetes.client.Configuration())
    with tempfile.TemporaryDirectory(prefix="gpuslice-bench-client-") as tmp:
        with controlplane.ControlPlane(binaries, tmp) as plane:
            plane.start(scheduler=False, controllers=False)
            results = asyncio.run(run(plane, args.pods, args.repeats))
    keys = list(results["official"][0])
    print(f"{'median of ' + str(args.repeats):<20}" + "".join(f"{k:>18}" for k in keys))
    medians = {name: {k: statistics.median(r[k] for r in runs) for k in keys} for name, runs in results.items()}
    for name, values in medians.items():
        print(f"{name:<20}" + "".join(f"{values[k]:>18.2f}" for k in keys))
    ratios = {k: medians["aiohttp"][k] / medians["official"][k] for k in keys}
    print(f"{'aiohttp / official':<20}" + "".join(f"{ratios[k]:>18.2f}" for k in keys))
    print(json.dumps({"pods": args.pods, "repeats": args.repeats, "runs": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
