"""The webhook's serving certificate: one live SSLContext, reloaded in place when the files change.

cert-manager (or any rotation) rewrites the certificate and key files; a background task polls
their content hash and calls `load_cert_chain` on the same SSLContext the server listens with.
New TLS handshakes get the new certificate; open connections keep theirs and are not dropped,
and the server never restarts. A half-written pair (certificate and key not matching yet) is
checked on a scratch context, skipped and retried on the next poll, so the old certificate
keeps serving meanwhile.

May import only the standard library.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import pathlib
import ssl

__all__ = ["CertificateError", "CertificateReloader", "server_context"]

log = logging.getLogger(__name__)


class CertificateError(ValueError):
    """The certificate or key file cannot be read or does not form a valid pair."""


def _load(context: ssl.SSLContext, cert_file: str, key_file: str) -> None:
    for path in (cert_file, key_file):
        if not pathlib.Path(path).is_file():
            raise CertificateError(f"cannot read TLS file {path}: no such file")
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise CertificateError(f"cannot load TLS certificate {cert_file} with key {key_file}: {exc}") from None


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A TLS server context (TLS 1.2+) serving the given certificate chain and key."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # No session tickets: kube-apiserver's webhook client keeps no session cache, so the two tickets
    # OpenSSL sends after every TLS 1.3 handshake are work (and a write) for nothing.
    context.num_tickets = 0
    context.options |= ssl.OP_NO_TICKET
    _load(context, cert_file, key_file)
    return context


def _fingerprint(*paths: str) -> str | None:
    digest = hashlib.sha256()
    for path in paths:
        try:
            digest.update(pathlib.Path(path).read_bytes())
        except OSError:
            return None
        digest.update(b"\0")
    return digest.hexdigest()


class CertificateReloader:
    """Polls the certificate files and reloads `context` in place when their content changes."""

    def __init__(self, context: ssl.SSLContext, cert_file: str, key_file: str, *, interval: float = 10.0) -> None:
        self.context = context
        self.cert_file = cert_file
        self.key_file = key_file
        self.interval = interval
        self.reloads = 0
        self._loaded = _fingerprint(cert_file, key_file)

    def check(self) -> bool:
        """Reload if the files changed and form a valid pair; True when a new certificate was loaded."""
        current = _fingerprint(self.cert_file, self.key_file)
        if current is None or current == self._loaded:
            return False
        try:
            # Try the pair on a scratch context first: a failed load_cert_chain leaves the live
            # context holding the new certificate with the old key, and every handshake fails.
            _load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), self.cert_file, self.key_file)
            _load(self.context, self.cert_file, self.key_file)
        except CertificateError as exc:
            log.warning("keeping the current certificate: %s", exc)
            return False
        self._loaded = current
        self.reloads += 1
        log.info("reloaded TLS certificate from %s", self.cert_file)
        return True

    async def run(self) -> None:
        """Poll forever (cancel to stop)."""
        while True:
            await asyncio.sleep(self.interval)
            # File reads are small; a thread keeps a slow volume from stalling admissions.
            await asyncio.to_thread(self.check)
