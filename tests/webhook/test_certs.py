"""The webhook's serving certificate (webhook/certs.py): a rotated certificate is served on new
connections while open ones keep theirs, a half-written pair is skipped, the background task
picks up a rotation by itself, and files that cannot be loaded raise a clear error. The webhook
runs over real HTTPS as in tests/webhook/test_server.py, whose kit these tests use."""

from __future__ import annotations

import asyncio
import pathlib
import ssl

import aiohttp
import pytest
import trustme
from test_server import SERVICE_DNS, Connection, Tls, _start, client_context

from gpuslice.webhook import certs


def der(leaf: trustme.LeafCert) -> bytes:
    return ssl.PEM_cert_to_DER_cert(leaf.cert_chain_pems[0].bytes().decode())


async def test_a_rotated_certificate_is_served_on_new_connections_and_old_ones_stay_open(
    tmp_path: pathlib.Path,
) -> None:
    old_ca, new_ca = trustme.CA(), trustme.CA()
    tls = Tls(tmp_path)
    old_leaf = tls.issue(old_ca)
    webhook = await _start(tls)
    context = client_context(old_ca, new_ca)
    old_connection = await Connection.open(webhook.port, context)
    try:
        assert await old_connection.get("/healthz") == 200
        new_leaf = tls.issue(new_ca)
        assert webhook.reloader.check() is True
        new_connection = await Connection.open(webhook.port, context)
        try:
            assert new_connection.peer_certificate() == der(new_leaf)
            assert await new_connection.get("/healthz") == 200
        finally:
            await new_connection.close()
        assert old_connection.peer_certificate() == der(old_leaf)
        assert await old_connection.get("/healthz") == 200  # not dropped
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_context(old_ca))) as client:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await client.get(webhook.url("/healthz"), server_hostname=SERVICE_DNS)
    finally:
        await old_connection.close()
        await webhook.runner.cleanup()


async def test_a_half_written_certificate_pair_is_skipped_and_the_old_one_keeps_serving(tmp_path: pathlib.Path) -> None:
    old_ca, new_ca = trustme.CA(), trustme.CA()
    tls = Tls(tmp_path)
    old_leaf = tls.issue(old_ca)
    webhook = await _start(tls)
    try:
        key = tls.key_file.read_bytes()
        leaf = new_ca.issue_cert(SERVICE_DNS)
        tls.cert_file.write_bytes(leaf.cert_chain_pems[0].bytes())  # new certificate, old key: not a pair yet
        assert webhook.reloader.check() is False
        connection = await Connection.open(webhook.port, client_context(old_ca, new_ca))
        try:
            assert connection.peer_certificate() == der(old_leaf)
        finally:
            await connection.close()
        tls.key_file.write_bytes(leaf.private_key_pem.bytes())
        assert key != tls.key_file.read_bytes() and webhook.reloader.check() is True
    finally:
        await webhook.runner.cleanup()


async def test_the_background_task_picks_up_a_rotation_by_itself(tmp_path: pathlib.Path) -> None:
    tls = Tls(tmp_path)
    tls.issue(trustme.CA())
    webhook = await _start(tls, reload_interval=0.02)
    try:
        new_ca = trustme.CA()
        new_leaf = tls.issue(new_ca)
        async with asyncio.timeout(10):
            while webhook.reloader.reloads == 0:
                await asyncio.sleep(0.02)
        connection = await Connection.open(webhook.port, client_context(new_ca))
        try:
            assert connection.peer_certificate() == der(new_leaf)
        finally:
            await connection.close()
    finally:
        await webhook.runner.cleanup()


def test_unreadable_or_mismatched_certificate_files_raise_a_clear_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(certs.CertificateError, match="no such file"):
        certs.server_context(str(tmp_path / "missing.crt"), str(tmp_path / "missing.key"))
    (tmp_path / "bad.crt").write_text("not a certificate")
    (tmp_path / "bad.key").write_text("not a key")
    with pytest.raises(certs.CertificateError, match="cannot load TLS certificate"):
        certs.server_context(str(tmp_path / "bad.crt"), str(tmp_path / "bad.key"))
