"""The `gpuslice-webhook` command: clear one-line errors, and a real process serving HTTPS end to end."""

from __future__ import annotations

import base64
import json
import os
import pathlib
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import trustme

from gpuslice.webhook import main

SERVICE_DNS = "gpuslice-webhook.gpuslice.svc"


@pytest.fixture
def tls(tmp_path: pathlib.Path) -> tuple[trustme.CA, pathlib.Path, pathlib.Path]:
    ca = trustme.CA()
    leaf = ca.issue_cert(SERVICE_DNS)
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    leaf.private_key_pem.write_to_path(str(key))
    cert.write_bytes(b"".join(b.bytes() for b in leaf.cert_chain_pems))
    return ca, cert, key


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--memory-unit-mib", "0"], "memoryUnitMiB: must be greater than 0"),
        (["--convert-whole-gpus", "maybe"], "convertWholeGpus: must be true or false"),
        (["--ignored-namespaces", "Kube_System"], "ignoredNamespaces"),
    ],
    ids=["unit-zero", "bad-bool", "bad-namespace"],
)
def test_configuration_errors_print_one_line_and_exit_2(
    tls: tuple[trustme.CA, pathlib.Path, pathlib.Path], capsys: pytest.CaptureFixture[str], extra: list[str], words: str
) -> None:
    _, cert, key = tls
    assert main.main(["--tls-cert-file", str(cert), "--tls-private-key-file", str(key), *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and err.startswith("gpuslice-webhook: ")


def test_a_missing_certificate_file_prints_one_line_and_exits_2(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "nope.crt")
    assert main.main(["--tls-cert-file", missing, "--tls-private-key-file", missing]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope.crt" in err


def test_a_config_file_with_an_unknown_key_is_refused(
    tls: tuple[trustme.CA, pathlib.Path, pathlib.Path], tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, cert, key = tls
    (tmp_path / "c.yaml").write_text("version: v1\ndefaultGpuMemoryMb: 1000\n")
    args = ["--config", str(tmp_path / "c.yaml"), "--tls-cert-file", str(cert), "--tls-private-key-file", str(key)]
    assert main.main(args) == 2
    assert "did you mean defaultGpuMemoryMiB" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_command_serves_https_without_a_cluster_and_stops_on_sigterm(
    tls: tuple[trustme.CA, pathlib.Path, pathlib.Path], tmp_path: pathlib.Path
) -> None:
    ca, cert, key = tls
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST", "KUBECONFIG")}
    env["HOME"] = str(tmp_path)  # no ~/.kube/config: no node watch, defaults used
    env["GPUSLICE_DEFAULT_GPU_MEMORY_MIB"] = "40960"
    env["GPUSLICE_WEBHOOK_SHUTDOWN_DELAY_SECONDS"] = "3"
    command = [
        sys.executable,
        "-m",
        "gpuslice.webhook.main",
        "--tls-cert-file",
        str(cert),
        "--tls-private-key-file",
        str(key),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        context = ssl.create_default_context()
        ca.configure_trust(context)
        context.check_hostname = False  # urllib dials 127.0.0.1; the DNS name is checked in test_webhook_server
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=context, timeout=2) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert process.poll() is None, process.stdout.read().decode() if process.stdout else ""
                assert time.monotonic() < deadline, "the webhook did not start"
                time.sleep(0.1)
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE",
                "namespace": "default",
                "object": {
                    "metadata": {"annotations": {"gpu-fraction": "0.5"}},
                    "spec": {"containers": [{"name": "c", "image": "i"}]},
                },
            },
        }
        request = urllib.request.Request(
            f"https://127.0.0.1:{port}/mutate",
            data=json.dumps(review).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, context=context, timeout=5) as r:
            answer = json.load(r)
        patch = json.loads(base64.b64decode(answer["response"]["patch"]))
        resources = next(op["value"] for op in patch if op["path"] == "/spec/containers/0/resources")
        assert resources["limits"] == {"gpuslice.io/gpu-memory": "80"}  # 0.5 x 40960 MiB from the environment
        # SIGTERM: for webhook.shutdownDelaySeconds it is not ready but still answers admissions
        # (the API server sends them until the pod's endpoint is removed), then it exits.
        stopped_at = time.monotonic()
        process.send_signal(signal.SIGTERM)
        while True:
            try:
                urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=context, timeout=2).close()
            except urllib.error.HTTPError as exc:
                assert exc.code == 503 and exc.read() == b"stopping\n"
                break
            assert time.monotonic() - stopped_at < 2, "/readyz still ready after SIGTERM"
            time.sleep(0.05)
        with urllib.request.urlopen(request, context=context, timeout=5) as r:
            assert json.load(r)["response"]["allowed"] is True
        assert process.poll() is None
        assert process.wait(timeout=20) == 0
        assert time.monotonic() - stopped_at >= 3
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            assert process.wait(timeout=20) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            if process.stdout:
                process.stdout.close()


def test_an_unusable_kubeconfig_prints_one_line_and_exits_2(
    tls: tuple[trustme.CA, pathlib.Path, pathlib.Path], tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, cert, key = tls
    (tmp_path / "kubeconfig").write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n")
    args = [
        "--tls-cert-file",
        str(cert),
        "--tls-private-key-file",
        str(key),
        "--kubeconfig",
        str(tmp_path / "kubeconfig"),
    ]
    assert main.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpuslice-webhook: ")
