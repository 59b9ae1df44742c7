"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager, built from k8s.io/kubernetes by e2e/k8s/build.sh, for the e2e tests and
`gpuslice-sim --scheduler kube`.

Everything listens on 127.0.0.1 and nothing is configured to dial elsewhere: the API server routes
to webhooks by URL or, for a `service:` reference, through Endpoints (`--enable-aggregator-routing`;
there are none, so it fails without dialling a ClusterIP); nodes have no addresses; no kubelet or
node controller runs (nodes are objects the caller creates, bound pods stay Pending), except on the
real node of tests/e2e/node, which starts one with `pod_access` (tests/e2e/node/realnode.py). After a run,
`foreign_dials()` lists any log line showing a dial to a non-loopback address.

Certificates come from one throwaway CA (`Pki`), users from a token file: `admin` (system:masters)
and `system:kube-scheduler`. Every process is started in its own session and killed at `stop()`,
at interpreter exit, or (Linux) by the kernel when the launcher itself dies.

May import cryptography, PyYAML and the standard library only.
"""

from __future__ import annotations

import atexit
import ctypes
import dataclasses
import datetime
import ipaddress
import json
import os
import pathlib
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "BINARIES",
    "KUBERNETES_SERVICE_IP",
    "Binaries",
    "ControlPlane",
    "ControlPlaneError",
    "Pki",
    "find_binaries",
    "free_port",
]

BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "dmharness", "draharness")
BIN_ENV = "GPUSLICE_K8S_BIN"
SERVICE_CIDR = "10.0.0.0/24"  # the API server needs one; nothing is routed to it but, on a real node, the next
KUBERNETES_SERVICE_IP = "10.0.0.1"  # the `kubernetes` Service's ClusterIP: the first address of SERVICE_CIDR
# The workload controllers a user's manifests rely on, quota status, namespace deletion and garbage
# collection. Not the node lifecycle, pod GC, service or route controllers: there are no kubelets.
CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "daemonset-controller",
    "job-controller",
    "cronjob-controller",
    "resourcequota-controller",
    "namespace-controller",
    "garbage-collector-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "disruption-controller",
)
_READY_TIMEOUT = 120.0


class ControlPlaneError(RuntimeError):
    """A component did not start or answer; the message names it and the tail of its log."""


@dataclasses.dataclass(frozen=True)
class Binaries:
    """The directory e2e/k8s/build.sh printed, and the Kubernetes version it was built from."""

    directory: pathlib.Path
    version: str

    def path(self, name: str) -> pathlib.Path:
        return self.directory / name


def find_binaries(directory: str | os.PathLike[str] | None = None) -> Binaries | None:
    """The built components from `directory` or $GPUSLICE_K8S_BIN; None when absent or incomplete."""
    where = directory or os.environ.get(BIN_ENV)
    if not where:
        return None
    root = pathlib.Path(where)
    if not all(os.access(root / name, os.X_OK) for name in BINARIES):
        return None
    version_file = root / "VERSION"
    version = version_file.read_text().strip() if version_file.exists() else "unknown"
    return Binaries(root, version)


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the launcher exits, however it exits (Linux prctl)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- certificates ---------------------------------------------------------------------------


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    # "EC PRIVATE KEY": the form every Kubernetes key flag reads (PKCS8 is refused as a public-key file).
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    )


class Pki:
    """A throwaway CA that signs serving and client certificates for one run."""

    def __init__(self, name: str = "gpuslice-e2e-ca") -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
            .sign(self.key, hashes.SHA256())
        )

    @property
    def ca_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        common_name: str,
        *,
        ips: Sequence[str] = ("127.0.0.1",),
        dns: Sequence[str] = ("localhost",),
        organizations: Sequence[str] = (),
        client: bool = False,
    ) -> tuple[bytes, bytes]:
        """(certificate PEM, private key PEM): a serving certificate, or a client one with `client`."""
        key = ec.generate_private_key(ec.SECP256R1())
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        attributes += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]),
                critical=False,
            )
        )
        if not client:
            names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
            names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


# --- processes --------------------------------------------------------------------------------


@dataclasses.dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: pathlib.Path

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


_LIVE: list[_Process] = []


def _kill_all() -> None:
    for process in list(_LIVE):
        _terminate(process)


def _terminate(process: _Process, grace: float = 10.0) -> None:
    if process.popen.poll() is None:
        try:
            os.killpg(process.popen.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            process.popen.wait(grace)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(process.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.popen.wait()
    if process in _LIVE:
        _LIVE.remove(process)


atexit.register(_kill_all)


def _https_get(url: str, cafile: str | None, token: str | None = None, timeout: float = 3.0) -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=cafile) if cafile else ssl._create_unverified_context()  # noqa: S323
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, context=context, timeout=timeout) as response:  # noqa: S310 - loopback
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


# Upstream component logs name the addresses they dial in these forms.
_DIAL = re.compile(r"dial(?:ing)? (?:tcp|udp)4?6? \[?([0-9a-fA-F:.]+?)\]?:\d+")


class ControlPlane:
    """etcd + kube-apiserver (+ kube-scheduler) on 127.0.0.1, in `workdir`."""

    def __init__(self, binaries: Binaries, workdir: str | os.PathLike[str], *, pod_access: bool = False) -> None:
        """`pod_access`: pods of a real kubelet will call this API server (tests/e2e/node): its serving
        certificate also names the kubernetes Service's address (`KUBERNETES_SERVICE_IP`, which the
        node forwards to the loopback port), and ServiceAccount admission stays on, so pods get tokens."""
        self.binaries = binaries
        self.pod_access = pod_access
        self.workdir = pathlib.Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.pki = Pki()
        self.processes: list[_Process] = []
        self.admin_token = secrets.token_hex(16)
        self._scheduler_token = secrets.token_hex(16)
        self.api_port = 0
        self.server = ""
        self.ca_file = str(self.workdir / "ca.crt")
        self.admin_kubeconfig = ""
        self.scheduler_urls: dict[str, str] = {}  # process name -> https://127.0.0.1:<secure port>

    # -- lifecycle --------------------------------------------------------------------------

    def start(
        self, *, scheduler: bool = True, controllers: bool = True, extra_apiserver_args: Sequence[str] = ()
    ) -> ControlPlane:
        try:
            self._write_pki()
            self._start_etcd()
            self._start_apiserver(extra_apiserver_args)
            self.admin_kubeconfig = self.write_kubeconfig("admin", token=self.admin_token)
            if scheduler:
                self.start_scheduler("kube-scheduler", profiles=[{"schedulerName": "default-scheduler"}])
            if controllers:
                self.start_controller_manager()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every process this control plane started (newest first)."""
        for process in reversed(self.processes):
            _terminate(process)
        self.processes.clear()

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def spawn(self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> _Process:
        """Start a process in its own session, logging to <workdir>/<name>.log; stopped with the rest."""
        log = self.workdir / f"{name}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen(  # noqa: S603 - our own binaries and arguments
                list(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509
                env={**os.environ, "NO_PROXY": "*", "no_proxy": "*", **(env or {})},
            )
        process = _Process(name, popen, log)
        self.processes.append(process)
        _LIVE.append(process)
        return process

    def stop_process(self, process: _Process) -> None:
        _terminate(process)
        if process in self.processes:
            self.processes.remove(process)

    def _wait(self, process: _Process, what: str, probe: Any, timeout: float = _READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.popen.poll() is not None:
                raise ControlPlaneError(f"{what} exited with status {process.popen.returncode}:\n{process.tail()}")
            try:
                if probe():
                    return
            except OSError:
                pass
            time.sleep(0.25)
        raise ControlPlaneError(f"{what} not ready after {timeout:.0f} s:\n{process.tail()}")

    # -- components -------------------------------------------------------------------------

    def _write_pki(self) -> None:
        api_cert, api_key = self.pki.issue(
            "kube-apiserver",
            ips=("127.0.0.1", KUBERNETES_SERVICE_IP) if self.pod_access else ("127.0.0.1",),
            dns=("localhost", "kubernetes", "kubernetes.default.svc"),
        )
        sa_key = ec.generate_private_key(ec.SECP256R1())
        files = {
            "ca.crt": self.pki.ca_pem,
            "apiserver.crt": api_cert,
            "apiserver.key": api_key,
            "sa.key": _pem_key(sa_key),
            "tokens.csv": (
                f'{self.admin_token},admin,uid-admin,"system:masters"\n'
                f"{self._scheduler_token},system:kube-scheduler,uid-kube-scheduler\n"
            ).encode(),
        }
        for name, data in files.items():
            path = self.workdir / name
            path.write_bytes(data)
            path.chmod(0o600)

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        data_dir = self.workdir / "etcd"
        shutil.rmtree(data_dir, ignore_errors=True)
        process = self.spawn(
            "etcd",
            [
                str(self.binaries.path("etcd")),
                "--name=e2e",
                f"--data-dir={data_dir}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=e2e=http://127.0.0.1:{peer}",
                "--listen-metrics-urls=",
                "--unsafe-no-fsync",
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            with urllib.request.urlopen(self.etcd_url + "/health", timeout=2) as response:  # noqa: S310 - loopback
                return bool(json.loads(response.read()).get("health") == "true")

        self._wait(process, "etcd", healthy)

    def _start_apiserver(self, extra: Sequence[str]) -> None:
        self.api_port = free_port()
        self.server = f"https://127.0.0.1:{self.api_port}"
        w = self.workdir
        process = self.spawn(
            "kube-apiserver",
            [
                str(self.binaries.path("kube-apiserver")),
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                f"--tls-cert-file={w / 'apiserver.crt'}",
                f"--tls-private-key-file={w / 'apiserver.key'}",
                f"--client-ca-file={w / 'ca.crt'}",
                f"--token-auth-file={w / 'tokens.csv'}",
                "--authorization-mode=Node,RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={w / 'sa.key'}",
                f"--service-account-signing-key-file={w / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                # Without a kubelet no pod needs a token, and nothing would lift the not-ready taint.
                "--disable-admission-plugins="
                + ("TaintNodesByCondition" if self.pod_access else "ServiceAccount,TaintNodesByCondition"),
                # A webhook or APIService that names a Service is resolved through its Endpoints (none
                # here), never by dialling the Service's ClusterIP.
                "--enable-aggregator-routing=true",
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                "--v=1",
                *extra,
            ],
        )

        def ready() -> bool:
            status, _ = _https_get(self.server + "/readyz", self.ca_file)
            return status == 200

        self._wait(process, "kube-apiserver", ready)

    def start_scheduler(
        self,
        name: str,
        *,
        profiles: Sequence[Mapping[str, Any]] = ({"schedulerName": "default-scheduler"},),
        configuration: Mapping[str, Any] | None = None,
        kubeconfig: str | None = None,
        qps: int = 200,
        burst: int = 400,
    ) -> _Process:
        """A kube-scheduler process: `configuration` (a KubeSchedulerConfiguration, e.g. the chart's) or a
        plain one running `profiles`; its client is `kubeconfig` (default: the system:kube-scheduler
        user) limited to `qps`/`burst` requests. Leader election is turned off: a restarted scheduler
        must not wait for an old lease."""
        kubeconfig = kubeconfig or self.write_kubeconfig("kube-scheduler", token=self._scheduler_token)
        configuration = dict(
            configuration
            or {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "profiles": list(profiles),
            }
        )
        configuration["clientConnection"] = {"kubeconfig": kubeconfig, "qps": qps, "burst": burst}
        configuration["leaderElection"] = {"leaderElect": False}
        config_file = self.workdir / f"{name}.yaml"
        config_file.write_text(yaml.safe_dump(configuration))
        port = free_port()
        process = self.spawn(
            name,
            [
                str(self.binaries.path("kube-scheduler")),
                f"--config={config_file}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--v=2",
            ],
        )

        def ready() -> bool:
            status, _ = _https_get(f"https://127.0.0.1:{port}/readyz", None)
            return status == 200

        self._wait(process, name, ready)
        self.scheduler_urls[name] = f"https://127.0.0.1:{port}"
        return process

    def cpu_profile(self, name: str, seconds: int) -> bytes:
        """A pprof CPU profile of the scheduler `name` over the next `seconds` (its /debug/pprof,
        on by default, asked as admin: the scheduler has the API server authorise the path)."""
        url = f"{self.scheduler_urls[name]}/debug/pprof/profile?seconds={seconds}"
        status, body = _https_get(url, None, self.admin_token, timeout=seconds + 30)
        if status != 200:
            raise RuntimeError(f"{name}: HTTP {status} for its CPU profile: {body[:200]!r}")
        return body

    def scheduler_metrics(self, name: str) -> str:
        """The scheduler `name`'s Prometheus metrics, as text (asked as admin, like its profiles)."""
        status, body = _https_get(f"{self.scheduler_urls[name]}/metrics", None, self.admin_token, timeout=30)
        if status != 200:
            raise RuntimeError(f"{name}: HTTP {status} for its metrics: {body[:200]!r}")
        return body.decode()

    def start_controller_manager(self, controllers: Sequence[str] = CONTROLLERS, *, qps: int = 200) -> _Process:
        """kube-controller-manager running `controllers` (never the node lifecycle controller: with no
        kubelet posting status it would taint every node unreachable)."""
        kubeconfig = self.admin_kubeconfig
        port = free_port()
        process = self.spawn(
            "kube-controller-manager",
            [
                str(self.binaries.path("kube-controller-manager")),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--controllers={','.join(controllers)}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--service-account-private-key-file={self.workdir / 'sa.key'}",
                f"--root-ca-file={self.ca_file}",
                f"--kube-api-qps={qps}",
                f"--kube-api-burst={2 * qps}",
                "--concurrent-deployment-syncs=5",
                "--v=1",
            ],
        )

        def ready() -> bool:
            status, _ = _https_get(f"https://127.0.0.1:{port}/healthz", None)
            return status == 200

        self._wait(process, "kube-controller-manager", ready)
        return process

    # -- clients ----------------------------------------------------------------------------

    def write_kubeconfig(self, user: str, *, token: str) -> str:
        """A kubeconfig for `user` with a bearer token (the Python client, helm and our binaries read it)."""
        path = self.workdir / f"{user.replace(':', '-')}.kubeconfig"
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {"name": "e2e", "cluster": {"server": self.server, "certificate-authority": self.ca_file}}
                    ],
                    "users": [{"name": user, "user": {"token": token}}],
                    "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
                    "current-context": "e2e",
                }
            )
        )
        path.chmod(0o600)
        return str(path)

    def version(self) -> str:
        status, body = _https_get(self.server + "/version", self.ca_file, self.admin_token)
        if status != 200:
            raise ControlPlaneError(f"GET /version answered {status}")
        return str(json.loads(body)["gitVersion"])

    def foreign_dials(self, allowed: Sequence[str] = ()) -> list[str]:
        """Log lines of our processes that show a dial to an address outside 127.0.0.0/8, ::1 and the
        `allowed` networks (a real node's pod CIDR: kubelet probes its pods)."""
        networks = [ipaddress.ip_network(n) for n in allowed]
        found = []
        for process in self.workdir.glob("*.log"):
            for line in process.read_text(errors="replace").splitlines():
                for match in _DIAL.finditer(line):
                    try:
                        address = ipaddress.ip_address(match.group(1))
                    except ValueError:
                        continue
                    if not address.is_loopback and not any(address in n for n in networks):
                        found.append(f"{process.name}: {line.strip()[:300]}")
        return found
