"""Idle TLS connections against the webhook: resident memory before, while N connections sit idle
after their handshake, and after the idle timeout has closed them; admissions keep being answered
meanwhile.

    .venv/bin/python benchmarks/bench_connections.py [--connections 2000] [--idle-timeout 5]

The webhook runs as its own process (the real `gpuslice-webhook` command, no cluster) with a
trustme certificate; this process opens the connections, sends nothing on them, and posts one
AdmissionReview every 0.2 s on a fresh connection. The webhook's RSS is read from /proc. Figures go
in docs/benchmarks.md ("Idle connections").
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


async def admissions(port: int, context: ssl.SSLContext, stop: asyncio.Event) -> tuple[int, int]:
    ok = failed = 0
    connector = aiohttp.TCPConnector(ssl=context, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        while not stop.is_set():
            try:
                async with session.post(
                    f"https://127.0.0.1:{port}/mutate", json=REVIEW, server_hostname=SERVICE_DNS
                ) as response:
                    ok += response.status == 200
                    failed += response.status != 200
            except aiohttp.ClientError:
                failed += 1
            await asyncio.sleep(0.2)
    return ok, failed


async def wait_closed(reader: asyncio.StreamReader) -> None:
    try:
        await reader.read(1)
    except (ConnectionError, ssl.SSLError):
        pass


async def run(args: argparse.Namespace, pid: int, port: int, context: ssl.SSLContext) -> dict[str, float]:
    figures = {"rss_before_mib": rss_mib(pid)}
    stop = asyncio.Event()
    traffic = asyncio.create_task(admissions(port, context, stop))
    started = time.perf_counter()
    idle = []
    for _ in range(args.connections):
        idle.append(await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname=SERVICE_DNS))
    figures["open_seconds"] = time.perf_counter() - started
    await asyncio.sleep(0.5)
    figures["rss_idle_mib"] = rss_mib(pid)
    opened = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(wait_closed(r) for r, _ in idle)), args.idle_timeout * 10 + 60)
    figures["closed_after_seconds"] = time.perf_counter() - opened
    for _, writer in idle:
        writer.close()
    await asyncio.sleep(max(2.0, args.idle_timeout / 2))  # a sweep or two: the heap trim
    figures["rss_after_mib"] = rss_mib(pid)
    stop.set()
    ok, failed = await traffic
    figures["admissions_ok"], figures["admissions_failed"] = ok, failed
    figures["kib_per_idle_connection"] = (figures["rss_idle_mib"] - figures["rss_before_mib"]) * 1024 / args.connections
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--idle-timeout", type=float, default=5.0)
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
            "--webhook-idle-timeout-seconds", str(args.idle_timeout),
            "--webhook-max-connections", str(args.connections + 100),
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
    print(json.dumps({"connections": args.connections, "idle_timeout_seconds": args.idle_timeout, **figures}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
