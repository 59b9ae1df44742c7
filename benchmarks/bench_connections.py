"""Idle TLS connections held against one webhook: with the chart's defaults, a client that opens
N connections, completes each handshake, sends nothing and reopens each one the webhook closes,
for `--hold` seconds; meanwhile another client posts one AdmissionReview every 0.2 s, each on a new
connection (or, `--kept-alive`, all on one, as kube-apiserver does). Measured: that client's
answers and their latency, how long the webhook let a silent connection live, the webhook's
resident memory before, at its highest while they are held, and after they are gone.

    .venv/bin/python benchmarks/bench_connections.py [--connections 1000] [--hold 30] [--kept-alive]

The webhook runs as its own process (the real `gpuslice-webhook` command, no cluster, default
webhook.* bounds) with a trustme certificate; its RSS is read from /proc. Figures go in
docs/benchmarks.md ("Idle connections").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import resource
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time

import aiohttp
import trustme

SERVICE_DNS = "gpuslice-webhook.gpuslice.svc"
REVIEW = {
    "apiVersion": "admission.k8s.io/v1",
    "kind": "AdmissionReview",
    "request": {
        "uid": "bench",
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "team-a",
        "operation": "CREATE",
        "object": {
            "metadata": {"annotations": {"gpu-fraction": "0.5"}},
            "spec": {"containers": [{"name": "main", "image": "x"}]},
        },
    },
}


def rss_mib(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def admissions(port: int, context: ssl.SSLContext, stop: asyncio.Event, kept: bool) -> list[float | None]:
    """Latency of each admission (None: not answered 200), each on a new connection, or (`kept`) on
    one kept-alive connection as kube-apiserver sends them."""
    latencies: list[float | None] = []
    connector = aiohttp.TCPConnector(ssl=context, force_close=not kept, limit=1)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                async with session.post(
                    f"https://127.0.0.1:{port}/mutate", json=REVIEW, server_hostname=SERVICE_DNS
                ) as response:
                    await response.read()
                    latencies.append(time.perf_counter() - started if response.status == 200 else None)
            except (aiohttp.ClientError, TimeoutError):
                latencies.append(None)
            await asyncio.sleep(0.2)
    return latencies


async def silent_connection(port: int, context: ssl.SSLContext, until: float, lifetimes: list[float]) -> None:
    """One connection slot of the idle client: connect, say nothing, reconnect when closed, until `until`."""
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname=SERVICE_DNS)
        except (OSError, ssl.SSLError):
            await asyncio.sleep(0.1)
            continue
        opened = time.monotonic()
        try:
            await asyncio.wait_for(reader.read(1), timeout=max(0.1, until - opened))
            lifetimes.append(time.monotonic() - opened)  # closed by the webhook
        except TimeoutError:
            pass  # still open when the hold ended
        except (ConnectionError, ssl.SSLError):
            lifetimes.append(time.monotonic() - opened)
        finally:
            writer.close()


async def run(args: argparse.Namespace, pid: int, port: int, context: ssl.SSLContext) -> dict[str, float]:
    figures: dict[str, float] = {"rss_before_mib": rss_mib(pid)}
    stop = asyncio.Event()
    traffic = asyncio.create_task(admissions(port, context, stop, args.kept_alive))
    until = time.monotonic() + args.hold
    lifetimes: list[float] = []
    holders = [asyncio.create_task(silent_connection(port, context, until, lifetimes)) for _ in range(args.connections)]
    highest = 0.0
    while time.monotonic() < until:
        await asyncio.sleep(0.5)
        highest = max(highest, rss_mib(pid))
    await asyncio.gather(*holders)
    figures["rss_highest_while_held_mib"] = highest
    await asyncio.sleep(12.0)  # their TLS shutdowns, then a sweep or two: the heap trim
    figures["rss_after_mib"] = rss_mib(pid)
    stop.set()
    latencies = await traffic
    answered = sorted(x for x in latencies if x is not None)
    figures["admissions_ok"] = len(answered)
    figures["admissions_failed"] = len(latencies) - len(answered)
    figures["admission_median_s"] = statistics.median(answered) if answered else float("nan")
    figures["admission_max_s"] = answered[-1] if answered else float("nan")
    figures["silent_connections_closed"] = len(lifetimes)
    lifetimes.sort()
    figures["silent_connection_median_life_s"] = statistics.median(lifetimes) if lifetimes else float("nan")
    figures["silent_connection_longest_life_s"] = lifetimes[-1] if lifetimes else float("nan")
    figures["admission_p99_s"] = answered[int(len(answered) * 0.99)] if answered else float("nan")
    figures["rss_growth_mib"] = highest - figures["rss_before_mib"]
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--kept-alive", action="store_true", help="admissions on one kept-alive connection")
    parser.add_argument("--hold", type=float, default=30.0, help="seconds the idle client holds its connections")
    args = parser.parse_args()
    raise_fd_limit()
    ca = trustme.CA()
    with tempfile.TemporaryDirectory() as directory:
        leaf = ca.issue_cert(SERVICE_DNS)
        cert, key = pathlib.Path(directory, "tls.crt"), pathlib.Path(directory, "tls.key")
        cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
        key.write_bytes(leaf.private_key_pem.bytes())
        port = free_port()
        env = {**os.environ, "HOME": directory}
        env.pop("KUBECONFIG", None)
        env.pop("KUBERNETES_SERVICE_HOST", None)
        command = [
            sys.executable, "-m", "gpuslice.webhook.main",
            "--tls-cert-file", str(cert), "--tls-private-key-file", str(key),
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING",
        ]  # fmt: skip
        webhook = subprocess.Popen(command, env=env, preexec_fn=raise_fd_limit)
        try:
            context = ssl.create_default_context()
            ca.configure_trust(context)
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or webhook.poll() is not None:
                        raise RuntimeError("the webhook did not start") from None
                    time.sleep(0.1)
            time.sleep(1.0)
            figures = asyncio.run(run(args, webhook.pid, port, context))
        finally:
            webhook.terminate()
            webhook.wait(10)
    print(
        json.dumps(
            {"connections": args.connections, "hold_seconds": args.hold, "kept_alive": args.kept_alive, **figures},
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
