"""The webhook's HTTP surface: an aiohttp app factory and a `start()` that serves it over HTTPS.

POST /mutate   AdmissionReview v1 -> AdmissionReview v1 (400 with a message when malformed)
GET  /healthz  the process answers
GET  /readyz   every watch has listed: nodes, pending and refused pods (or there is no cluster to watch);
               503 once the process is stopping
GET  /metrics  Prometheus text

The handler only reads the body, calls `admission.review` and writes the answer; the app's own
background tasks (certificate reload, node watch) live in its cleanup context: created on start,
cancelled and awaited on shutdown. The other loops (the pacer's Lease, waiting and refused pods)
are runnables beside the server under the process's supervisor (webhook/main.py).

May import gpuslice.{config,listwatch} and the webhook's modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson
from aiohttp import web

from gpuslice import config, listwatch
from gpuslice.webhook import admission, certs, claim_templates, connections, nodewatch, repeats
from gpuslice.webhook import cluster as cluster_
from gpuslice.webhook import metrics as metrics_

__all__ = ["CLUSTER", "METRICS", "SETTINGS", "make_app", "start"]

log = logging.getLogger(__name__)

SETTINGS = web.AppKey("settings", config.Config)
CLUSTER = web.AppKey("cluster", cluster_.ClusterView)
METRICS = web.AppKey("metrics", metrics_.Metrics)
WATCHER = web.AppKey("watcher", object)  # nodewatch.NodeWatcher | None
RELOADER = web.AppKey("reloader", object)  # certs.CertificateReloader | None
TEMPLATES = web.AppKey("templates", claim_templates.ClaimTemplates)  # DRA mode
LISTED = web.AppKey("listed", tuple)  # more watches (listwatch.ListWatch) that must list before /readyz is ok
BOOK = web.AppKey("book", connections.Book)
REPEATS = web.AppKey("repeats", repeats.RepeatAnswers)
STOPPING = web.AppKey("stopping", asyncio.Event)  # set on SIGTERM: /readyz fails while the server drains

# A pod is at most ~1.5 MiB in etcd; an AdmissionReview carries it once for CREATE.
MAX_BODY_BYTES = 8 * 1024 * 1024
_JSON = "application/json"
LINGER_SECONDS = 1.0


async def _mutate(request: web.Request) -> web.Response:
    app = request.app
    started = time.perf_counter()
    metrics = app[METRICS]
    if request.content.is_eof():  # the whole body has arrived (the usual case): no wait to bound
        body = await request.read()
    else:
        try:
            async with asyncio.timeout(app[SETTINGS].webhook.body_timeout_seconds):
                body = await request.read()
        except TimeoutError:
            response = web.Response(status=408, text="request body not received in time\n")
            response.force_close()
            return response
    try:
        answer, encoded = app[REPEATS].review(body, settings=app[SETTINGS], cluster=app[CLUSTER])
    except admission.MalformedReview as exc:
        metrics.count("malformed")
        return web.Response(status=400, text=f"malformed AdmissionReview: {exc}\n")
    if answer.outcome is not None and answer.outcome.objects and not answer.dry_run:
        try:  # DRA mode: the claim template the pod references must exist before it is admitted
            for obj in answer.outcome.objects:
                namespace = obj["metadata"].get("namespace") or _request_namespace(body)
                await app[TEMPLATES].ensure(namespace, obj)
        except claim_templates.TemplateError as exc:
            metrics.count(admission.RESULT_DENIED)
            return web.Response(
                body=orjson.dumps(claim_templates.denial(answer.response, str(exc))), content_type=_JSON
            )
    outcome = answer.outcome
    metrics.count(answer.result, outcome.kind if outcome is not None and not answer.dry_run else "")
    response = web.Response(body=encoded, content_type=_JSON)
    metrics.observe(time.perf_counter() - started)
    return response


@web.middleware
async def _count_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Count every 5xx answer by path and status; an unexpected exception is logged and answered
    500 here, so none escapes uncounted (bad input must not get here: it is a 400 or a denial).
    A connection past webhook.maxConnectionAgeSeconds is closed with its answer."""
    book = request.app[BOOK]
    book.begin(request.protocol)  # busy: never closed to make room for another connection
    try:
        response: web.StreamResponse = await handler(request)
    except web.HTTPException as exc:
        if exc.status >= 500:
            request.app[METRICS].http_error(request.path, exc.status).inc()
        raise
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        request.app[METRICS].http_error(request.path, 500).inc()
        return web.Response(status=500, text="internal error; see the webhook's log\n")
    finally:
        book.end(request.protocol, asyncio.get_running_loop().time())
    if response.status >= 500:
        request.app[METRICS].http_error(request.path, response.status).inc()
    settings = request.app[SETTINGS].webhook
    connections.retire_if_old(request, response, book, settings.max_connection_age_seconds)
    return response


def _request_namespace(body: bytes) -> str:
    """The AdmissionReview's request namespace (a pod object may leave its namespace out)."""
    return str((orjson.loads(body).get("request") or {}).get("namespace") or "")


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def _readyz(request: web.Request) -> web.Response:
    if request.app[STOPPING].is_set():
        return web.Response(status=503, text="stopping\n")
    watcher = request.app[WATCHER]
    if isinstance(watcher, nodewatch.NodeWatcher) and not watcher.synced.is_set():
        return web.Response(status=503, text="node list not synced yet\n")
    # Not ready before the pending pods are listed either: until then this replica steers by its own
    # promises alone, and a Service should send admissions to a replica that knows the others'.
    for watch in request.app[LISTED]:
        if not watch.synced.is_set():
            return web.Response(status=503, text=f"{watch.what} not listed yet\n")
    return web.Response(text="ok\n")


async def _metrics(request: web.Request) -> web.Response:
    body, content_type = request.app[METRICS].exposition()
    return web.Response(body=body, headers={"Content-Type": content_type})


async def _background(app: web.Application) -> AsyncIterator[None]:
    tasks: list[asyncio.Task[None]] = []
    reloader = app[RELOADER]
    watcher = app[WATCHER]
    if isinstance(reloader, certs.CertificateReloader):
        tasks.append(asyncio.create_task(reloader.run(), name="gpuslice-webhook-cert-reload"))
    if isinstance(watcher, nodewatch.NodeWatcher):
        tasks.append(asyncio.create_task(watcher.run(), name="gpuslice-webhook-node-watch"))
    yield
    if isinstance(watcher, nodewatch.NodeWatcher):
        watcher.stop()
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


def make_app(
    settings: config.Config,
    cluster: cluster_.ClusterView,
    *,
    metrics: metrics_.Metrics | None = None,
    watcher: nodewatch.NodeWatcher | None = None,
    reloader: certs.CertificateReloader | None = None,
    templates: claim_templates.ClaimTemplates | None = None,
    listed: Sequence[listwatch.ListWatch] = (),
) -> web.Application:
    """The webhook application; `watcher` and `reloader` run as its background tasks; it is
    ready once `watcher` and every watch of `listed` have listed."""
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_count_errors])
    app[SETTINGS] = settings
    app[CLUSTER] = cluster
    app[METRICS] = metrics or metrics_.Metrics()
    app[METRICS].track_untrusted_nodes(lambda: cluster.untrusted)
    app[METRICS].track_pacer(lambda: cluster.pacer_alive)
    app[METRICS].track_cpu_pod_share(lambda: cluster.cpu_demand.share)
    app[WATCHER] = watcher
    app[RELOADER] = reloader
    app[TEMPLATES] = templates or claim_templates.ClaimTemplates()
    app[LISTED] = tuple(listed)
    app[BOOK] = connections.Book()
    app[REPEATS] = repeats.RepeatAnswers()
    app[STOPPING] = asyncio.Event()
    app[METRICS].track_repeats(lambda: app[REPEATS].repeats)
    app.router.add_post("/mutate", _mutate)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics)
    app.cleanup_ctx.append(_background)
    return app


async def start(app: web.Application, ssl_context: ssl.SSLContext, *, host: str, port: int) -> web.AppRunner:
    """Start serving `app` over HTTPS; the caller owns the runner (`await runner.cleanup()`).
    Port 0 picks a free port: read it from `runner.addresses`."""
    bounds = app[SETTINGS].webhook
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        shutdown_timeout=10.0,
        # aiohttp arms this when a connection opens and after each answer, and closes a connection
        # still waiting for (the rest of) a request's headers when it fires: idle and header time.
        keepalive_timeout=bounds.idle_timeout_seconds,
        # After answering a request whose body was not read (408, 413), read and drop the rest for
        # at most this long before closing (aiohttp's default is 10 s, which a slow sender keeps).
        lingering_time=LINGER_SECONDS,
    )
    await runner.setup()
    try:
        site = connections.BoundedSite(
            runner, host, port, ssl_context=ssl_context, settings=bounds, metrics=app[METRICS], book=app[BOOK]
        )
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
