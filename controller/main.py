"""`gpuslice-controller`: the requeuer and the pacer, on the replica that leads.

  gpuslice-controller [--config FILE] [--kubeconfig F] [--port 8080] [--host 0.0.0.0]
                      [--identity NAME] [configuration flags]

GET /healthz  the process answers
GET /readyz   its watches have listed (a standby is ready too: it takes over warm)
GET /metrics  Prometheus text (plain HTTP: nothing secret)

The process is a gpuslice/runtime.py supervisor: the requeuer, the pacer, then the campaign
(runtime.LeaderElection over controller/leader.py), stopped in reverse order.

Every replica lists and watches the Failed pods (the requeuer) and, with `pacing.enabled`, every
unfinished pod and every node (the pacer); once they have listed it campaigns for the Lease
`controller.leaseName` in `controller.leaseNamespace` (default: its own namespace, POD_NAMESPACE)
as `--identity` (default: POD_NAME, else the host name). Only the leader requeues and releases
(controller/leader.py); the webhook gates pods only while a leader renews that Lease.

Configuration errors print one line naming the problem and exit with status 2. SIGTERM and SIGINT
stop it: the leader gives its Lease up so a standby takes over at once; gated pods wait for the
next leader, and the requeue journal keeps what was under way, so nothing is lost.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
from collections.abc import Sequence

import kubernetes
import prometheus_client

from gpuslice import config, kubeclient, runtime
from gpuslice.controller import leader, requeue
from gpuslice.pacer import controller as pacer_

__all__ = ["build_parser", "main", "runnables"]

log = logging.getLogger("gpuslice.controller")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuslice-controller",
        description="Recreates converted pods kubelet refused and, with pacing on, releases the pods the webhook "
        "gated; its replicas elect one leader that acts (docs/architecture.md).",
    )
    parser.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: in-cluster, then ~/.kube/config)")
    parser.add_argument("--port", type=int, default=8080, help="HTTP port for health and metrics (default 8080)")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default all)")
    parser.add_argument(
        "--identity",
        default=os.environ.get("POD_NAME") or socket.gethostname(),
        help="name held in the Lease while leading (default: POD_NAME, else the host name)",
    )
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    config.add_arguments(parser, "controller")
    return parser


def _track_leadership(election: leader.Leadership, registry: prometheus_client.CollectorRegistry) -> None:
    leading = prometheus_client.Gauge(
        "gpuslice_controller_leading", "1 while this replica leads (requeues and paces)", registry=registry
    )
    leading.set_function(lambda: float(election.leading))
    taken = prometheus_client.Counter(
        "gpuslice_controller_leadership_taken", "Times this replica took the Lease", registry=registry
    )
    election.watch(lambda now_leading: taken.inc() if now_leading else None)


def runnables(
    args: argparse.Namespace, settings: config.Config, api: kubernetes.client.CoreV1Api
) -> tuple[list[runtime.Runnable], runtime.Health]:
    """The requeuer and the pacer (their watches run on every replica: a standby takes over warm),
    then the campaign, which begins once they have listed; and the health app, ready once they
    have (a standby is ready too)."""
    registry = prometheus_client.CollectorRegistry()
    namespace = settings.controller.lease_namespace_in(os.environ)
    election = leader.Leadership(
        kubernetes.client.CoordinationV1Api(api.api_client),
        name=settings.controller.lease_name,
        namespace=namespace,
        identity=args.identity,
        lease_seconds=settings.controller.lease_seconds,
    )
    _track_leadership(election, registry)
    feeds: list[runtime.Runnable] = []
    if settings.requeue.enabled:
        requeuer = requeue.Requeuer(
            api,
            settings,
            registry=registry,
            paced=lambda: settings.pacing.enabled,  # the leader is the pacer: a replacement is gated like a new pod
            namespace=os.environ.get("POD_NAMESPACE") or "default",  # the journal's: the controller's own
        )
        election.watch(requeuer.set_leading)
        feeds.append(runtime.Component("requeuer", run=requeuer.run, ready=requeuer.failed.synced.is_set))
    if settings.pacing.enabled:
        pacer = pacer_.Pacer(api, settings, registry=registry, leading=False)
        election.watch(pacer.set_leading)
        feeds.append(runtime.Component("pacer", run=pacer.run, ready=lambda: pacer.synced))
    campaign = runtime.LeaderElection(
        election,
        after=lambda: all(feed.ready() for feed in feeds),
        announce=f"views listed: campaigning for Lease {namespace}/{settings.controller.lease_name}",
    )
    health = runtime.Health(
        port=args.port,
        host=args.host,
        registry=registry,
        checks=lambda: {feed.name: feed.ready() for feed in feeds},
        waiting="watches not listed yet",
    )
    # Stopped first (reverse order): the leader gives its Lease up before its watches end.
    return [*feeds, campaign], health


async def _run(args: argparse.Namespace, settings: config.Config, api: kubernetes.client.CoreV1Api) -> None:
    parts, health = runnables(args, settings, api)
    await runtime.Supervisor(parts, health=health).run()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = config.from_args(args)
        api = kubeclient.core_api_from_flag(args.kubeconfig)
    except (config.ConfigError, kubernetes.config.ConfigException) as exc:
        print(f"gpuslice-controller: {exc}", file=sys.stderr)
        return 2
    if api is None:
        print(
            "gpuslice-controller: no cluster found (not in a pod, no --kubeconfig, no ~/.kube/config)", file=sys.stderr
        )
        return 2
    if settings.dra.enabled or not (settings.requeue.enabled or settings.pacing.enabled):
        why = (
            "dra.enabled is true (DRA mode refuses nothing on the node)"
            if settings.dra.enabled
            else ("requeue.enabled and pacing.enabled are both false")
        )
        print(f"gpuslice-controller: nothing to do: {why}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_run(args, settings, api))
    except runtime.RunnableFailed as exc:  # logged with its traceback: here one line naming it
        print(f"gpuslice-controller: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - e.g. a port in use: one clear line
        print(f"gpuslice-controller: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
