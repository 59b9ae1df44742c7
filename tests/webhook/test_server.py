"""The webhook over real HTTPS: certificates verified as kube-apiserver does (a CA bundle and the
Service DNS name), malformed reviews, metrics and probes. (Certificate rotation in place:
tests/webhook/test_certs.py.)"""

from __future__ import annotations

import asyncio
import base64
import json
import pathlib
import ssl
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import reviewkit
import trustme

from gpuslice import config, listwatch
from gpuslice.webhook import certs, cluster, cpudemand, server
from gpuslice.webhook import metrics as metrics_

SERVICE_DNS = "gpuslice-webhook.gpuslice.svc"
SETTINGS = config.Config()


def review(
    uid: str = "11111111-2222-3333-4444-555555555555", dry_run: bool = False, **annotations: str
) -> dict[str, Any]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "web-", "namespace": "team-a", "annotations": annotations or {"team": "a"}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }
    return reviewkit.pod_create(pod, uid=uid, dry_run=dry_run)


class Tls:
    """A CA and serving-certificate files, as cert-manager would mount them."""

    def __init__(self, directory: pathlib.Path) -> None:
        self.directory = directory
        self.cert_file = directory / "tls.crt"
        self.key_file = directory / "tls.key"

    def issue(self, ca: trustme.CA) -> trustme.LeafCert:
        leaf = ca.issue_cert(SERVICE_DNS, f"{SERVICE_DNS}.cluster.local")
        self.cert_file.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
        self.key_file.write_bytes(leaf.private_key_pem.bytes())
        return leaf


def client_context(*cas: trustme.CA) -> ssl.SSLContext:
    """What kube-apiserver does with caBundle: trust only these CAs and check the Service DNS name."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    for ca in cas:
        ca.configure_trust(context)
    return context


class Running:
    def __init__(self, runner: Any, metrics: metrics_.Metrics, reloader: certs.CertificateReloader) -> None:
        self.runner = runner
        self.metrics = metrics
        self.reloader = reloader
        self.port = runner.addresses[0][1]
        self.view: cluster.ClusterView | None = None

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}{path}"


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def tls(tmp_path: pathlib.Path, ca: trustme.CA) -> Tls:
    files = Tls(tmp_path)
    files.issue(ca)
    return files


async def _start(tls: Tls, reload_interval: float = 3600.0) -> Running:
    context = certs.server_context(str(tls.cert_file), str(tls.key_file))
    reloader = certs.CertificateReloader(context, str(tls.cert_file), str(tls.key_file), interval=reload_interval)
    metrics = metrics_.Metrics()
    view = cluster.ClusterView(SETTINGS.contract, default_gpu_memory_mib=SETTINGS.default_gpu_memory_mib)
    app = server.make_app(SETTINGS, view, metrics=metrics, reloader=reloader)
    runner = await server.start(app, context, host="127.0.0.1", port=0)
    running = Running(runner, metrics, reloader)
    running.view = view
    return running


@pytest.fixture
async def webhook(tls: Tls) -> AsyncIterator[Running]:
    running = await _start(tls)
    try:
        yield running
    finally:
        await running.runner.cleanup()


@pytest.fixture
async def session(ca: trustme.CA) -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(ssl=client_context(ca))
    async with aiohttp.ClientSession(connector=connector) as client:
        yield client


async def post(session: aiohttp.ClientSession, webhook: Running, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with session.post(
        webhook.url("/mutate"), data=data, headers={"Content-Type": "application/json"}, server_hostname=SERVICE_DNS
    ) as response:
        text = await response.text()
        return response.status, json.loads(text) if response.status == 200 else text


# --- serving -------------------------------------------------------------------------------


async def test_the_serving_certificate_verifies_against_the_ca_for_the_service_dns_name(
    webhook: Running, session: aiohttp.ClientSession
) -> None:
    status, body = await post(session, webhook, review(**{"gpu-memory": "2000"}))
    assert status == 200
    patch = json.loads(base64.b64decode(body["response"]["patch"]))
    assert any(op["path"] == "/spec/containers/0/resources" for op in patch)


async def test_a_client_checking_another_name_or_another_ca_refuses_the_certificate(
    webhook: Running, ca: trustme.CA
) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_context(ca))) as client:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await client.get(webhook.url("/healthz"), server_hostname="other.gpuslice.svc")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_context(trustme.CA()))) as client:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await client.get(webhook.url("/healthz"), server_hostname=SERVICE_DNS)


async def test_plain_http_is_not_served(webhook: Running) -> None:
    async with aiohttp.ClientSession() as client:
        with pytest.raises(aiohttp.ClientError):
            await client.get(f"http://127.0.0.1:{webhook.port}/healthz")


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"this is not json", "not JSON"),
        (json.dumps({"apiVersion": "v1", "kind": "Pod"}).encode(), "expected kind AdmissionReview"),
        (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(), "no request"),
    ],
    ids=["not-json", "wrong-kind", "no-request"],
)
async def test_malformed_reviews_get_400_and_the_server_keeps_serving(
    webhook: Running, session: aiohttp.ClientSession, body: bytes, words: str
) -> None:
    status, text = await post(session, webhook, body)
    assert status == 400 and words in text
    status, answer = await post(session, webhook, review(uid="after-the-bad-one"))
    assert status == 200 and answer["response"]["uid"] == "after-the-bad-one"


async def test_a_body_over_the_size_limit_gets_413_and_the_server_keeps_serving(
    webhook: Running, session: aiohttp.ClientSession
) -> None:
    status, text = await post(session, webhook, b"{" + b" " * server.MAX_BODY_BYTES + b"}")
    assert status == 413 and "maximum request body size" in text.lower()
    status, answer = await post(session, webhook, review(uid="after-the-big-one"))
    assert status == 200 and answer["response"]["uid"] == "after-the-big-one"


@pytest.mark.parametrize(
    "annotations",
    [
        {"gpu-memory": "1" * 309},
        {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "²"},
        {"gpu-memory": "1e999999999"},
    ],
    ids=["309-digits", "superscript-two", "huge-exponent"],
)
async def test_bad_values_are_denied_with_a_message_not_a_500(
    webhook: Running, session: aiohttp.ClientSession, annotations: dict[str, str]
) -> None:
    status, answer = await post(session, webhook, review(**annotations))
    assert status == 200 and answer["response"]["allowed"] is False
    assert "accepted" in answer["response"]["status"]["message"]


class BrokenView(cluster.ClusterView):
    def classes(self) -> list[cluster.GpuClass]:
        raise RuntimeError("a bug")


async def test_an_internal_error_is_answered_500_and_counted(tls: Tls, ca: trustme.CA) -> None:
    context = certs.server_context(str(tls.cert_file), str(tls.key_file))
    metrics = metrics_.Metrics()
    view = BrokenView(SETTINGS.contract, default_gpu_memory_mib=SETTINGS.default_gpu_memory_mib)
    runner = await server.start(server.make_app(SETTINGS, view, metrics=metrics), context, host="127.0.0.1", port=0)
    running = Running(runner, metrics, None)  # type: ignore[arg-type]
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_context(ca))) as client:
            status, text = await post(client, running, review(**{"gpu-fraction": "0.5"}))
            assert status == 500 and "internal error" in text
            status, _ = await post(client, running, review())  # a pod without a GPU does not reach the view
            assert status == 200
    finally:
        await runner.cleanup()
    body, _ = metrics.exposition()
    assert 'gpuslice_webhook_http_errors_total{path="/mutate",status="500"} 1.0' in body.decode()


async def test_concurrent_requests_each_get_their_own_uid(webhook: Running, session: aiohttp.ClientSession) -> None:
    uids = [f"uid-{i}" for i in range(40)]
    answers = await asyncio.gather(*(post(session, webhook, review(uid=u, **{"gpu-fraction": "0.25"})) for u in uids))
    assert [a[1]["response"]["uid"] for a in answers] == uids


async def test_probes_answer_and_metrics_count_results_and_conversions(
    webhook: Running, session: aiohttp.ClientSession
) -> None:
    await post(session, webhook, review(**{"gpu-memory": "2000"}))
    await post(session, webhook, review(dry_run=True, **{"gpu-memory": "2000"}))
    await post(session, webhook, review(**{"gpu-fraction": "7"}))
    await post(session, webhook, review())  # asks for no device: given the CPU-pod preferences
    await post(session, webhook, review(**{"gpu-fraction-container-name": "main"}))  # nothing to convert
    await post(session, webhook, b"nope")
    for path in ("/healthz", "/readyz"):
        async with session.get(webhook.url(path), server_hostname=SERVICE_DNS) as response:
            assert response.status == 200
    async with session.get(webhook.url("/metrics"), server_hostname=SERVICE_DNS) as response:
        text = await response.text()
    assert 'gpuslice_webhook_admissions_total{result="mutated"} 3.0' in text
    assert 'gpuslice_webhook_admissions_total{result="denied"} 1.0' in text
    assert 'gpuslice_webhook_admissions_total{result="unchanged"} 1.0' in text
    assert 'gpuslice_webhook_admissions_total{result="malformed"} 1.0' in text
    assert 'gpuslice_webhook_conversions_total{kind="gpu-memory"} 1.0' in text  # the dry run is not counted
    assert 'gpuslice_webhook_conversions_total{kind="cpu-pod"} 1.0' in text
    assert "gpuslice_webhook_admission_duration_seconds_count 5.0" in text
    assert "gpuslice_webhook_cpu_pod_cpu_share NaN" in text  # two pods counted: too few to say


async def test_metrics_say_what_share_of_the_cpu_cpu_only_pods_ask(
    webhook: Running, session: aiohttp.ClientSession
) -> None:
    assert webhook.view is not None
    for _ in range(cpudemand.MIN_PODS):
        webhook.view.cpu_demand.note(3000, device=False)
        webhook.view.cpu_demand.note(1000, device=True)
    async with session.get(webhook.url("/metrics"), server_hostname=SERVICE_DNS) as response:
        text = await response.text()
    share = next(line for line in text.splitlines() if line.startswith("gpuslice_webhook_cpu_pod_cpu_share "))
    assert float(share.split()[1]) == pytest.approx(0.75, abs=1e-3)


# --- one raw connection (test_certs.py and test_connections.py use it too) -----------------


class Connection:
    """One raw keep-alive HTTPS connection, so a test knows exactly which connection it uses."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int, context: ssl.SSLContext) -> Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname=SERVICE_DNS)
        return cls(reader, writer)

    def peer_certificate(self) -> bytes:
        return self.writer.get_extra_info("ssl_object").getpeercert(binary_form=True)

    async def get(self, path: str) -> int:
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: {SERVICE_DNS}\r\nConnection: keep-alive\r\n\r\n".encode())
        await self.writer.drain()
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        length = next(int(line.split(":")[1]) for line in lines if line.lower().startswith("content-length"))
        await self.reader.readexactly(length)
        return int(lines[0].split()[1])

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


class Unlisted(listwatch.ListWatch):
    """A watch that is never run: it has not listed until the test says so."""

    def __init__(self) -> None:
        super().__init__(lambda: None, "pending pods")


async def test_not_ready_until_every_watch_has_listed(tls: Tls, ca: trustme.CA) -> None:
    context = certs.server_context(str(tls.cert_file), str(tls.key_file))
    view = cluster.ClusterView(SETTINGS.contract, default_gpu_memory_mib=SETTINGS.default_gpu_memory_mib)
    pending = Unlisted()
    runner = await server.start(server.make_app(SETTINGS, view, listed=[pending]), context, host="127.0.0.1", port=0)
    running = Running(runner, metrics_.Metrics(), None)  # type: ignore[arg-type]
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_context(ca))) as client:
            async with client.get(running.url("/readyz"), server_hostname=SERVICE_DNS) as response:
                assert (response.status, await response.text()) == (503, "pending pods not listed yet\n")
            status, _ = await post(client, running, review(**{"gpu-fraction": "0.5"}))
            assert status == 200  # admissions are answered all the same
            pending.synced.set()
            async with client.get(running.url("/readyz"), server_hostname=SERVICE_DNS) as response:
                assert response.status == 200
    finally:
        await runner.cleanup()
