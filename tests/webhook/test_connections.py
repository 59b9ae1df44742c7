"""Connection bounds of the webhook over real TLS: idle connections are closed after the idle
timeout while admissions go on, connections that send nothing after the first-request timeout,
slow bodies time out, old connections are retired after their request, a connection over the cap
closes the one idle the longest, and is answered 503 only when every other is mid-request."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import ssl
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import test_server as kit
import trustme

from gpuslice import config
from gpuslice.webhook import certs, cluster, connections, server
from gpuslice.webhook import metrics as metrics_


class Webhook:
    def __init__(self, runner: Any, metrics: metrics_.Metrics) -> None:
        self.runner = runner
        self.metrics = metrics
        self.port = runner.addresses[0][1]
        (self.site,) = [s for s in runner.sites if isinstance(s, connections.BoundedSite)]

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}{path}"


async def start(tls: kit.Tls, **bounds: Any) -> Webhook:
    settings = dataclasses.replace(config.Config(), webhook=config.WebhookConfig(**bounds))
    context = certs.server_context(str(tls.cert_file), str(tls.key_file))
    metrics = metrics_.Metrics()
    view = cluster.ClusterView(settings.contract, default_gpu_memory_mib=settings.default_gpu_memory_mib)
    runner = await server.start(server.make_app(settings, view, metrics=metrics), context, host="127.0.0.1", port=0)
    return Webhook(runner, metrics)


@pytest.fixture
def tls(tmp_path: Any, ca: trustme.CA) -> kit.Tls:
    files = kit.Tls(tmp_path)
    files.issue(ca)
    return files


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
async def fresh_session(ca: trustme.CA) -> AsyncIterator[aiohttp.ClientSession]:
    """A new connection per request: a test's admissions never race an idle close."""
    connector = aiohttp.TCPConnector(ssl=kit.client_context(ca), force_close=True)
    async with aiohttp.ClientSession(connector=connector) as client:
        yield client


async def admit(session: aiohttp.ClientSession, webhook: Webhook, uid: str) -> int:
    body = json.dumps(kit.review(uid=uid, **{"gpu-fraction": "0.5"})).encode()
    async with session.post(webhook.url("/mutate"), data=body, server_hostname=kit.SERVICE_DNS) as response:
        answer = await response.json() if response.status == 200 else None
        assert answer is None or answer["response"]["uid"] == uid
        return response.status


async def open_idle(port: int, context: ssl.SSLContext) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname=kit.SERVICE_DNS)


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    try:
        return await reader.read(1) == b""
    except (ConnectionError, ssl.SSLError):
        return True


async def test_idle_tls_connections_are_closed_after_the_idle_timeout_while_admissions_go_on(
    tls: kit.Tls, ca: trustme.CA, fresh_session: aiohttp.ClientSession
) -> None:
    webhook = await start(tls, idle_timeout_seconds=1.0)
    context = kit.client_context(ca)
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for _ in range(300):  # handshake done, then silence
            idle.append(await open_idle(webhook.port, context))
        waits = [asyncio.ensure_future(closed_by_server(reader)) for reader, _ in idle]
        statuses = [await admit(fresh_session, webhook, f"during-{i}") for i in range(20)]
        assert statuses == [200] * 20
        async with asyncio.timeout(60):
            assert all(await asyncio.gather(*waits))
        async with asyncio.timeout(30):
            while webhook.site.open_connections():
                await asyncio.sleep(0.05)
        assert await admit(fresh_session, webhook, "after") == 200
    finally:
        for _, writer in idle:
            writer.close()
        await webhook.runner.cleanup()


async def test_a_connection_that_sends_half_its_headers_is_closed_by_the_idle_timeout(
    tls: kit.Tls, ca: trustme.CA
) -> None:
    webhook = await start(tls, idle_timeout_seconds=0.5)
    reader, writer = await open_idle(webhook.port, kit.client_context(ca))
    try:
        writer.write(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Ty")
        await writer.drain()
        async with asyncio.timeout(30):
            assert await closed_by_server(reader)
    finally:
        writer.close()
        await webhook.runner.cleanup()


async def test_a_body_that_does_not_arrive_in_time_gets_408(tls: kit.Tls, ca: trustme.CA) -> None:
    webhook = await start(tls, body_timeout_seconds=0.3)
    reader, writer = await open_idle(webhook.port, kit.client_context(ca))
    try:
        writer.write(
            b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        await writer.drain()
        async with asyncio.timeout(30):
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408")
            await reader.readuntil(b"\n")  # the body's one line
            assert await closed_by_server(reader)
    finally:
        writer.close()
        await webhook.runner.cleanup()


async def test_a_connection_past_its_age_is_closed_after_its_request(tls: kit.Tls, ca: trustme.CA) -> None:
    webhook = await start(tls, max_connection_age_seconds=0.3)
    reader, writer = await open_idle(webhook.port, kit.client_context(ca))
    connection = kit.Connection(reader, writer)
    answered = 0
    try:
        async with asyncio.timeout(30):
            while True:
                try:
                    assert await connection.get("/healthz") == 200
                except (asyncio.IncompleteReadError, ConnectionError):
                    break  # the server closed it between two requests, never in the middle of one
                answered += 1
                await asyncio.sleep(0.05)
        assert answered >= 1
    finally:
        writer.close()
        await webhook.runner.cleanup()


async def test_over_the_cap_a_new_connection_closes_the_one_idle_the_longest(
    tls: kit.Tls, ca: trustme.CA, fresh_session: aiohttp.ClientSession
) -> None:
    webhook = await start(tls, max_connections=5)
    context = kit.client_context(ca)
    used = kit.Connection(*await open_idle(webhook.port, context))
    assert await used.get("/healthz") == 200  # sent a request: closed after those that never did
    idle = [await open_idle(webhook.port, context) for _ in range(4)]
    try:
        async with asyncio.timeout(30):
            while webhook.site.open_connections() < 5:
                await asyncio.sleep(0.05)
        assert await admit(fresh_session, webhook, "sixth") == 200
        async with asyncio.timeout(30):
            assert await closed_by_server(idle[0][0])  # the first that never sent a request
        assert await used.get("/healthz") == 200
        for reader, _ in idle[1:]:
            assert not reader.at_eof()
        body = webhook.metrics.exposition()[0].decode()
        assert 'gpuslice_webhook_connections_closed_total{reason="evicted"} 1.0' in body
        assert "gpuslice_webhook_connections_refused_total 0.0" in body
    finally:
        used.writer.close()
        for _, w in idle:
            w.close()
        await webhook.runner.cleanup()


async def test_a_connection_that_sends_no_request_is_closed_after_the_first_request_timeout(
    tls: kit.Tls, ca: trustme.CA
) -> None:
    webhook = await start(tls, first_request_timeout_seconds=0.5, idle_timeout_seconds=60)
    context = kit.client_context(ca)
    silent_reader, silent = await open_idle(webhook.port, context)
    used = kit.Connection(*await open_idle(webhook.port, context))
    try:
        assert await used.get("/healthz") == 200
        async with asyncio.timeout(10):
            assert await closed_by_server(silent_reader)
        await asyncio.sleep(0.5)
        assert await used.get("/healthz") == 200  # kept: only the idle timeout closes it
        body = webhook.metrics.exposition()[0].decode()
        assert 'gpuslice_webhook_connections_closed_total{reason="no request"} 1.0' in body
    finally:
        silent.close()
        used.writer.close()
        await webhook.runner.cleanup()


async def test_when_every_connection_is_mid_request_one_more_is_answered_503_and_counted(
    tls: kit.Tls, ca: trustme.CA, fresh_session: aiohttp.ClientSession
) -> None:
    webhook = await start(tls, max_connections=3, body_timeout_seconds=30)
    context = kit.client_context(ca)
    waiting = [await open_idle(webhook.port, context) for _ in range(3)]
    try:
        for _, writer in waiting:  # headers, then no body: each is mid-request
            writer.write(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
            writer.write(b"Content-Length: 100\r\n\r\n{")
            await writer.drain()
        async with asyncio.timeout(30):
            while len(webhook.site.book.busy) < 3:
                await asyncio.sleep(0.05)
        reader, writer = await open_idle(webhook.port, context)
        async with asyncio.timeout(30):
            head = await reader.read()
        writer.close()
        assert head.startswith(b"HTTP/1.1 503")
        for _, w in waiting[:2]:
            w.close()
        async with asyncio.timeout(30):
            while webhook.site.open_connections() > 1:
                await asyncio.sleep(0.05)
        assert await admit(fresh_session, webhook, "room-again") == 200
        body = webhook.metrics.exposition()[0].decode()
        assert "gpuslice_webhook_connections_refused_total 1.0" in body
        assert 'gpuslice_webhook_http_errors_total{path="other",status="503"} 1.0' in body
    finally:
        for _, w in waiting[2:]:
            w.close()
        await webhook.runner.cleanup()
