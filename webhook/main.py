"""`gpuslice-webhook`: wires configuration, certificates, the cluster view and the server.

  gpuslice-webhook [--config FILE] --tls-cert-file F --tls-private-key-file F [--port 8443]
                   [--kubeconfig F] [configuration flags]

Configuration or certificate errors print one line naming the problem and exit with status 2.
SIGTERM and SIGINT stop serving gracefully (background tasks cancelled and awaited): the process
is a gpuslice/runtime.py supervisor of the HTTPS server and the webhook's own loops.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import ssl
import sys
from collections.abc import Sequence

import kubernetes
from aiohttp import web

from gpuslice import config, kubeclient, listwatch, runtime
from gpuslice.webhook import certs, claim_templates, nodewatch, pacerlease, server, waiting
from gpuslice.webhook import cluster as cluster_
from gpuslice.webhook import metrics as metrics_

__all__ = ["build_parser", "main"]

log = logging.getLogger("gpuslice.webhook")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuslice-webhook",
        description="Mutating admission webhook: KAI-style gpu-fraction / gpu-memory annotations "
        "become gpuslice extended resources.",
    )
    parser.add_argument("--tls-cert-file", required=True, metavar="FILE", help="serving certificate (PEM chain)")
    parser.add_argument("--tls-private-key-file", required=True, metavar="FILE", help="serving private key (PEM)")
    parser.add_argument("--port", type=int, default=8443, help="HTTPS port (default 8443)")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default all)")
    parser.add_argument(
        "--kubeconfig", metavar="FILE", help="kubeconfig for the node watch (default: in-cluster, then ~/.kube/config)"
    )
    parser.add_argument(
        "--cert-reload-seconds", type=float, default=10.0, help="how often the certificate files are checked"
    )
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    config.add_arguments(parser, "webhook")
    return parser


def _runnables(
    args: argparse.Namespace, settings: config.Config, api: kubernetes.client.CoreV1Api | None
) -> list[runtime.Runnable]:
    context = certs.server_context(args.tls_cert_file, args.tls_private_key_file)
    reloader = certs.CertificateReloader(
        context, args.tls_cert_file, args.tls_private_key_file, interval=args.cert_reload_seconds
    )
    view = cluster_.ClusterView(
        settings.contract,
        default_gpu_memory_mib=settings.default_gpu_memory_mib,
        extended_resources=not settings.dra.enabled,
    )
    watcher = nodewatch.NodeWatcher(api, view) if api is not None else None
    if watcher is None:
        log.info("no cluster found: gpu-fraction uses defaultGpuMemoryMiB=%d", settings.default_gpu_memory_mib)
    metrics = metrics_.Metrics()
    loops: list[runtime.Runnable] = []  # the webhook's own watches and Lease reader, beside the server
    listed: list[listwatch.ListWatch] = []
    # Promises of pods never stored, that no node takes or that kubelet refused go back, and other
    # replicas' conversions are promised here too (webhook/waiting.py). The webhook writes nothing
    # else: refused pods are recreated by the controller (controller/requeue.py).
    waiting_pods = waiting.WaitingPods(api, view) if api is not None else None
    if api is not None and settings.pacing.enabled and not settings.dra.enabled:
        # Pods are gated only while a controller leads: its leader releases them (webhook/pacerlease.py);
        # no cluster: never.
        lease = pacerlease.PacerLease(
            kubernetes.client.CoordinationV1Api(api.api_client),
            view,
            name=settings.controller.lease_name,
            namespace=settings.controller.lease_namespace_in(os.environ),
            lease_seconds=settings.controller.lease_seconds,
        )
        loops.append(runtime.Component("gpuslice-webhook-pacer-lease", run=lease.run))
    if api is not None and waiting_pods is not None:
        loops.append(runtime.Component("gpuslice-webhook-waiting-pods", run=waiting_pods.run))
        listed.append(waiting_pods)
        if not settings.dra.enabled:  # kubelet refuses nothing in DRA mode
            refused = waiting.RefusedPods(api, waiting_pods)
            loops.append(runtime.Component("gpuslice-webhook-refused-pods", run=refused.run))
            listed.append(refused)
        watched = waiting_pods

        def promises_returned() -> dict[str, int]:
            view.ledger.outstanding()  # gives back what is overdue: the scrape's figure is current without admissions
            return {
                "unschedulable": watched.released,
                "not-created": view.ledger.not_created,
                "refused": watched.refused,
            }

        metrics.track_promises_returned(promises_returned)
        metrics.track_shared_promises(lambda: view.ledger.track_appearance, lambda: view.ledger.promised_from_others)
    # DRA mode: claim templates are created with the same credentials as the node watch (--kubeconfig).
    templates = (
        claim_templates.ClaimTemplates(claim_templates.KubernetesTemplateApi(api.api_client))
        if api is not None and settings.dra.enabled
        else None
    )
    app = server.make_app(
        settings,
        view,
        metrics=metrics,
        watcher=watcher,
        reloader=reloader,
        templates=templates,
        listed=listed,
    )
    # Everything built so far (the Kubernetes client's many modules included) lives as long as the
    # process: keep it out of the garbage collector's full scans, which each admission's JSON triggers.
    gc.freeze()
    delay = settings.webhook.shutdown_delay_seconds
    return [*loops, _server(app, context, host=args.host, port=args.port, shutdown_delay=delay)]


def _server(
    app: web.Application, context: ssl.SSLContext, *, host: str, port: int, shutdown_delay: float
) -> runtime.Component:
    """The HTTPS server: /mutate, and the probes' /healthz and /readyz and /metrics on the same port
    (webhook/server.py), so the runtime serves no app of its own here. Stopped first: the loops
    above keep the view current while connections drain. Stopping, it first serves on for
    `shutdown_delay` seconds with /readyz failing: the API server keeps sending admissions to a
    deleted pod until the pod's endpoint is removed, and one sent to a closed port is refused."""
    runner: web.AppRunner | None = None

    async def start() -> None:
        nonlocal runner
        runner = await server.start(app, context, host=host, port=port)
        log.info("gpuslice webhook serving https://%s:%d/mutate", host, port)

    async def stop() -> None:
        if runner is not None:
            app[server.STOPPING].set()
            if shutdown_delay:
                log.info("stopping: serving %g s more while the endpoint is removed", shutdown_delay)
                await asyncio.sleep(shutdown_delay)
            await runner.cleanup()

    return runtime.Component("gpuslice-webhook-server", start=start, stop=stop)


async def _run(args: argparse.Namespace, settings: config.Config, api: kubernetes.client.CoreV1Api | None) -> None:
    await runtime.Supervisor(_runnables(args, settings, api)).run()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = config.from_args(args)
        certs.server_context(args.tls_cert_file, args.tls_private_key_file)  # fail fast, before serving
        api = kubeclient.core_api_from_flag(args.kubeconfig)
    except (config.ConfigError, certs.CertificateError, kubernetes.config.ConfigException) as exc:
        print(f"gpuslice-webhook: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_run(args, settings, api))
    except runtime.RunnableFailed as exc:  # logged with its traceback: here one line naming it
        print(f"gpuslice-webhook: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - e.g. a bad kubeconfig or a port in use: one clear line
        print(f"gpuslice-webhook: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
