"""`gpuslice-pacer`: wires configuration, the Kubernetes client, the pacer and its HTTP surface.

  gpuslice-pacer [--config FILE] [--kubeconfig F] [--port 8080] [--host 0.0.0.0] [configuration flags]

GET /healthz  the process answers
GET /readyz   both watches have listed once
GET /metrics  Prometheus text (plain HTTP: nothing secret)

Once its watches have listed it renews the Lease `pacing.leaseName` in `pacing.leaseNamespace`
(default: its own namespace, POD_NAMESPACE) as its host name (the pod's name); the webhook gates
pods only while that Lease is renewed.

Configuration errors print one line naming the problem and exit with status 2. SIGTERM and SIGINT
stop it (the watches and the release loop cancelled and awaited); gated pods wait for the next
pacer, nothing is lost.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence

import kubernetes
import prometheus_client
from aiohttp import web

from gpuslice import config
from gpuslice.pacer import controller, heartbeat
from gpuslice.webhook import nodewatch

__all__ = ["build_parser", "main"]

log = logging.getLogger("gpuslice.pacer")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuslice-pacer",
        description="Releases the pods the webhook gated, keeping each off nodes whose labels lag (docs/steering.md).",
    )
    parser.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: in-cluster, then ~/.kube/config)")
    parser.add_argument("--port", type=int, default=8080, help="HTTP port for health and metrics (default 8080)")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default all)")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    config.add_arguments(parser, "pacer")
    return parser


def make_app(pacer: controller.Pacer, registry: prometheus_client.CollectorRegistry) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ok") if pacer.synced else web.Response(status=503, text="watches not listed yet")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=prometheus_client.generate_latest(registry), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


async def _run(args: argparse.Namespace, settings: config.Config, api: kubernetes.client.CoreV1Api) -> None:
    registry = prometheus_client.CollectorRegistry()
    beat = heartbeat.Heartbeat(
        kubernetes.client.CoordinationV1Api(api.api_client),
        name=settings.pacing.lease_name,
        namespace=settings.pacing.lease_namespace_in(os.environ),
        identity=socket.gethostname(),
        lease_seconds=settings.pacing.lease_seconds,
    )
    pacer = controller.Pacer(api, settings, registry=registry, heartbeat=beat)
    runner = web.AppRunner(make_app(pacer, registry))
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    pacing = asyncio.create_task(pacer.run(), name="pacer")
    stopping = asyncio.create_task(stop.wait(), name="pacer-stop")
    try:
        done, _ = await asyncio.wait({pacing, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if pacing in done:
            pacing.result()  # an unexpected end is an error, not a quiet exit
    finally:
        for task in (pacing, stopping):
            task.cancel()
        await asyncio.gather(pacing, stopping, return_exceptions=True)
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = config.from_args(args)
        api = nodewatch.api_from_environment(args.kubeconfig)
    except (config.ConfigError, kubernetes.config.ConfigException) as exc:
        print(f"gpuslice-pacer: {exc}", file=sys.stderr)
        return 2
    if api is None:
        print("gpuslice-pacer: no cluster found (not in a pod, no --kubeconfig, no ~/.kube/config)", file=sys.stderr)
        return 2
    try:
        asyncio.run(_run(args, settings, api))
    except Exception as exc:  # noqa: BLE001 - e.g. a port in use: one clear line
        print(f"gpuslice-pacer: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
