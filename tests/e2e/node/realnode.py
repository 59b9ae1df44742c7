"""A real node on this machine for the tests: containerd and a whole kubelet joined to the real control
plane (sim/controlplane.py), running pods from locally made images. Facts and every knob's reason:
../shared/reference/real-node.md.

    node = RealNode(parts, workdir); node.start(); ...; node.stop()

What it sets up, and `stop()` takes down again, leaving the machine as it was:

* containerd (e2e/node/build.sh) with its root, state and sockets under the work directory, Debian's
  runc, `restrict_oom_score_adj` (this VM withholds CAP_SYS_RESOURCE, so runc cannot lower a pause
  container's oom_score_adj), the pause image made here as its sandbox image; the images given are
  imported, none is ever pulled;
* a CNI bridge (`gsl0`, pod CIDR 10.88.0.0/24, no masquerade, no default route: pods reach the host
  and the Service CIDR only);
* the control plane with pod access: 10.0.0.1:443 (the `kubernetes` Service) is DNAT'ed to the
  loopback API server and `route_localnet` is on, so pods' in-cluster configuration works without
  kube-proxy; kube-controller-manager also runs the ResourceClaim and root-CA publisher controllers;
* kubelet (cgroupfs driver, cgroup v1 allowed), named `127.0.0.1` (an IP-literal hostname becomes its
  only InternalIP: kubelet refuses a loopback --node-ip), serving on 127.0.0.1 with certificates of
  the control plane's CA, root directory /var/lib/kubelet (its device-plugin directory is fixed
  there: one node per machine).

`stop()` stops kubelet, every container and containerd's shims, unmounts what kubelet and containerd
mounted, deletes the network namespaces made since `start()`, the bridge, the DNAT rule and
kubelet's own iptables chains, restores route_localnet, removes /var/lib/kubelet, kubelet's pod logs
and the kubepods cgroups. Needs root, runc, the CNI plugins and iptables (e2e/node/install-packages.sh).

May import the standard library, PyYAML, k8skit and gpuslice.sim.controlplane.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import k8skit
import yaml

from gpuslice.sim import controlplane

__all__ = ["NODE_NAME", "POD_CIDR", "MockDriver", "NodeParts", "NodeUnavailable", "RealNode", "find_parts"]

NODE_NAME = "127.0.0.1"
POD_CIDR = "10.88.0.0/24"
BRIDGE = "gsl0"
KUBELET_ROOT = pathlib.Path("/var/lib/kubelet")
# Paths kubelet writes whatever its flags say (pod logs and their links).
KUBELET_FIXED_DIRS = (pathlib.Path("/var/log/pods"), pathlib.Path("/var/log/containers"))
CNI_BIN = pathlib.Path("/usr/lib/cni")
# Where containerd reads CDI specifications (the DRA plugin writes its own into the second).
CDI_DIRS = (pathlib.Path("/etc/cdi"), pathlib.Path("/var/run/cdi"))
NODE_ENV = "GPUSLICE_NODE_DIR"  # e2e/node/build.sh's directory
IMAGE_ENV = "GPUSLICE_IMAGE_TAR"  # the gpuslice image (e2e/image/build.sh)
NVML_ENV = "GPUSLICE_NVML_DIR"  # the NVML on go-nvml's mock GPUs (e2e/nvml/build.sh)
_DNAT_COMMENT = "gpuslice-e2e-pod-api"
_KUBELET_CHAINS = ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT")


class NodeUnavailable(RuntimeError):
    """The node cannot run here; the message says which part is missing and how to get it."""


@dataclasses.dataclass(frozen=True)
class NodeParts:
    k8s: controlplane.Binaries  # with kubelet
    node_dir: pathlib.Path  # containerd, containerd-shim-runc-v2, ctr, pause.tar, busybox.tar
    images: tuple[pathlib.Path, ...] = ()  # docker-archive tars imported into containerd
    nvml_dir: pathlib.Path | None = None  # libnvidia-ml.so.1 built on go-nvml's mock GPUs


def find_parts(images: Sequence[str | os.PathLike[str]] = ()) -> NodeParts:
    """The built parts, or NodeUnavailable naming the first one missing."""
    if os.geteuid() != 0:
        raise NodeUnavailable("a real node needs root (containerd, kubelet, mounts, iptables)")
    k8s = controlplane.find_binaries()
    if k8s is None:
        raise NodeUnavailable(f"the Kubernetes components are not built (${controlplane.BIN_ENV}; `make k8s`)")
    if not os.access(k8s.path("kubelet"), os.X_OK):
        raise NodeUnavailable(f"no kubelet in {k8s.directory}: rebuild with e2e/k8s/build.sh")
    where = os.environ.get(NODE_ENV)
    if not where:
        raise NodeUnavailable(f"containerd and the node images are not built (${NODE_ENV}; e2e/node/build.sh)")
    node_dir = pathlib.Path(where)
    for name in (
        "containerd",
        "containerd-shim-runc-v2",
        "ctr",
        "nvidia-container-runtime",
        "pause.tar",
        "busybox.tar",
    ):
        if not (node_dir / name).exists():
            raise NodeUnavailable(f"{node_dir / name} is missing: rerun e2e/node/build.sh")
    for tool in ("runc", "iptables", "ip"):
        if shutil.which(tool) is None:
            raise NodeUnavailable(f"{tool} is not installed: run e2e/node/install-packages.sh")
    if not (CNI_BIN / "bridge").exists():
        raise NodeUnavailable(f"the CNI plugins are not in {CNI_BIN}: run e2e/node/install-packages.sh")
    for image in images:
        if not pathlib.Path(image).is_file():
            raise NodeUnavailable(f"the image {image} is not built (e2e/image/build.sh)")
    nvml = os.environ.get(NVML_ENV)
    if not nvml or not (pathlib.Path(nvml) / "libnvidia-ml.so.1").is_file():
        raise NodeUnavailable(f"the NVML mock is not built (${NVML_ENV}; e2e/nvml/build.sh)")
    return NodeParts(k8s, node_dir, tuple(pathlib.Path(i) for i in images), pathlib.Path(nvml))


def _run(*argv: str, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=timeout)  # noqa: S603


class RealNode:
    """containerd + CNI bridge + the control plane + kubelet; `start()`, then `stop()` (always)."""

    def __init__(self, parts: NodeParts, workdir: pathlib.Path, *, pod_cidr: str = POD_CIDR) -> None:
        self.parts = parts
        self.workdir = workdir
        self.pod_cidr = pod_cidr
        self.plane = controlplane.ControlPlane(parts.k8s, workdir / "cp", pod_access=True)
        self.socket = workdir / "containerd.sock"
        self.containerd: Any = None
        self.kubelet: Any = None
        self._netns_before: set[str] = set()
        self._cdi_dirs_before = {d for d in CDI_DIRS if d.exists()}
        self._route_localnet: str | None = None
        self._dnat: list[str] = []
        self._kubelet_argv: list[str] = []
        self._files: dict[str, str] = {}  # certificates and keys written for kubelet and the API server
        self._kubelet_port = 0
        self.timings: dict[str, float] = {}

    # -- start ------------------------------------------------------------------------------------

    def start(self) -> RealNode:
        if (KUBELET_ROOT / "device-plugins" / "kubelet.sock").exists() and _kubelet_running():
            raise NodeUnavailable("a kubelet already runs on this machine: one node per machine")
        self._clean_stale()
        started = time.monotonic()
        try:
            self._netns_before = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
            self._start_containerd()
            self.timings["containerd"] = time.monotonic() - started
            self._import_images()
            self.timings["images"] = time.monotonic() - started
            self._start_control_plane()
            self.timings["control plane"] = time.monotonic() - started
            self._start_kubelet()
            self.timings["node Ready"] = time.monotonic() - started
        except BaseException:
            self.stop()
            raise
        return self

    def _clean_stale(self) -> None:
        """Leftovers of a run that died without its teardown (no kubelet runs: checked above). A stale
        DNAT rule matters most: it would send every pod's API traffic to that run's closed port."""
        _kill_processes_under(self.parts.node_dir)  # a killed run's containerd and shims
        self._unmount_under((str(KUBELET_ROOT),))
        if KUBELET_ROOT.exists() or any(d.exists() for d in KUBELET_FIXED_DIRS):
            shutil.rmtree(KUBELET_ROOT, ignore_errors=True)
            for directory in KUBELET_FIXED_DIRS:
                shutil.rmtree(directory, ignore_errors=True)
        if os.path.isdir("/run/netns"):
            for name in os.listdir("/run/netns"):
                if name.startswith("cni-"):  # CNI's names for pod sandboxes
                    _run("ip", "netns", "delete", name, check=False)
        _run("ip", "link", "del", BRIDGE, check=False)
        for rule in _run("iptables", "-t", "nat", "-S", "PREROUTING", check=False).stdout.splitlines():
            if _DNAT_COMMENT in rule:
                _run("iptables", "-t", "nat", *shlex.split(rule.replace("-A ", "-D ", 1)), check=False)
        _remove_kubelet_chains()
        _remove_kubepods_cgroups()
        left = leftovers(self.parts.node_dir)
        if left:
            raise NodeUnavailable("a previous run left what cannot be cleaned: " + "; ".join(left))

    def _start_containerd(self) -> None:
        w = self.workdir
        for d in ("cni/net.d", "cni/ipam", "containerd/root", "containerd/state"):
            (w / d).mkdir(parents=True, exist_ok=True)
        (w / "cni/net.d/10-gpuslice.conflist").write_text(json.dumps(self._cni_config(), indent=1))
        default = _run(str(self.parts.node_dir / "containerd"), "config", "default").stdout
        (w / "containerd.toml").write_text(self._containerd_config(default))
        (w / "nvidia-container-runtime.toml").write_text(self._nvidia_runtime_config())
        self.containerd = self.plane.spawn(
            "containerd",
            [str(self.parts.node_dir / "containerd"), "--config", str(w / "containerd.toml")],
            env={
                # Its shims are started from PATH: ours first, not another containerd's.
                "PATH": f"{self.parts.node_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                # The shims start the nvidia runtime with containerd's environment: its configuration.
                "NVIDIA_CTK_CONFIG_FILE_PATH": str(w / "nvidia-container-runtime.toml"),
            },
        )
        k8skit.wait_for("containerd's socket", lambda: self.socket.is_socket() and self._ctr_ok(), timeout=30)

    def _ctr_ok(self) -> bool:
        if self.containerd.popen.poll() is not None:
            raise NodeUnavailable(f"containerd exited:\n{self.containerd.tail()}")
        return self.ctr("version", check=False).returncode == 0

    def _cni_config(self) -> dict[str, Any]:
        service = str(ipaddress.ip_network(controlplane.SERVICE_CIDR))
        return {
            "cniVersion": "1.0.0",
            "name": "gpuslice-e2e",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,  # pods reach nothing beyond this machine
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.pod_cidr}]],
                        "dataDir": str(self.workdir / "cni/ipam"),
                        "routes": [{"dst": service}],  # the API server's Service address only
                    },
                },
                {"type": "loopback"},
            ],
        }

    def _containerd_config(self, default: str) -> str:
        w = self.workdir
        edits = (
            (r"(?m)^root = .*$", f"root = '{w}/containerd/root'"),
            (r"(?m)^state = .*$", f"state = '{w}/containerd/state'"),
            (r"address = '/run/containerd/containerd.sock'", f"address = '{self.socket}'"),
            (r"address = '/run/containerd/containerd.sock.ttrpc'", f"address = '{self.socket}.ttrpc'"),
            (r"sandbox = '[^']*'", "sandbox = 'localhost/pause:3.10'"),
            (r"bin_dirs = \[[^\]]*\]", f"bin_dirs = ['{CNI_BIN}']"),
            (r"conf_dir = '/etc/cni/net.d'", f"conf_dir = '{w}/cni/net.d'"),
            # This VM withholds CAP_SYS_RESOURCE: runc cannot lower oom_score_adj below containerd's own.
            (r"restrict_oom_score_adj = false", "restrict_oom_score_adj = true"),
        )
        text = default
        for pattern, replacement in edits:
            text, count = re.subn(pattern, replacement, text)
            if count == 0:
                raise NodeUnavailable(f"containerd's default configuration has no {pattern!r}: a new version?")
        if "enable_cdi = true" not in text:
            raise NodeUnavailable("containerd's default configuration does not enable CDI")
        # The `nvidia` runtime handler, as NVIDIA's GPU Operator configures containerd: runc through
        # NVIDIA's container runtime (the chart's plugin runs under RuntimeClass nvidia by default).
        runtimes = "plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes"
        if f"[{runtimes}.runc]" not in text:
            raise NodeUnavailable(f"containerd's default configuration has no [{runtimes}.runc]")
        runtime = self.parts.node_dir / "nvidia-container-runtime"
        text += (
            f"\n[{runtimes}.nvidia]\n  runtime_type = 'io.containerd.runc.v2'\n"
            f"\n[{runtimes}.nvidia.options]\n  BinaryName = '{runtime}'\n"
        )
        return text

    def _nvidia_runtime_config(self) -> str:
        """NVIDIA's container runtime in CDI mode: NVIDIA_VISIBLE_DEVICES names CDI devices of kind
        nvidia.com/gpu (a UUID, or `all`), found in the specifications under /etc/cdi and
        /var/run/cdi, applied to the container's OCI spec before runc runs it."""
        runc = shutil.which("runc")
        if runc is None:
            raise NodeUnavailable("runc is not installed: run e2e/node/install-packages.sh")
        return (
            "[nvidia-container-runtime]\n"
            f'mode = "cdi"\nruntimes = ["{runc}"]\nlog-level = "info"\n'
            f'debug = "{self.workdir / "nvidia-container-runtime.log"}"\n'
            "[nvidia-container-runtime.modes.cdi]\n"
            'default-kind = "nvidia.com/gpu"\nspec-dirs = ["/etc/cdi", "/var/run/cdi"]\n'
            'annotation-prefixes = ["cdi.k8s.io/"]\n'
        )

    def ctr(self, *args: str, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        ctr = str(self.parts.node_dir / "ctr")
        return _run(ctr, "--address", str(self.socket), "--namespace", "k8s.io", *args, check=check, timeout=timeout)

    def _import_images(self) -> None:
        for tar in (self.parts.node_dir / "pause.tar", self.parts.node_dir / "busybox.tar", *self.parts.images):
            self.ctr("images", "import", str(tar), timeout=300)

    def _start_control_plane(self) -> None:
        plane = self.plane
        plane.workdir.mkdir(parents=True, exist_ok=True)
        files = {}
        # The API server's calls to kubelet (logs, exec): a system:masters client certificate.
        for name, (cn, orgs, client) in {
            "apiserver-kubelet-client": ("kube-apiserver-kubelet-client", ["system:masters"], True),
            "kubelet-client": (f"system:node:{NODE_NAME}", ["system:nodes"], True),
            "kubelet-serving": ("kubelet", [], False),
        }.items():
            cert, key = plane.pki.issue(cn, organizations=orgs, client=client)
            for suffix, data in (("crt", cert), ("key", key)):
                path = plane.workdir / f"{name}.{suffix}"
                path.write_bytes(data)
                path.chmod(0o600)
                files[f"{name}.{suffix}"] = str(path)
        self._files = files
        plane.start(
            controllers=False,
            extra_apiserver_args=[
                f"--kubelet-client-certificate={files['apiserver-kubelet-client.crt']}",
                f"--kubelet-client-key={files['apiserver-kubelet-client.key']}",
                f"--kubelet-certificate-authority={plane.ca_file}",
                "--kubelet-preferred-address-types=InternalIP",
            ],
        )
        plane.start_controller_manager(
            controllers=(
                *controlplane.CONTROLLERS,
                "resourceclaim-controller",  # ResourceClaims from templates (DRA)
                # Services' endpoints: the API server reaches an in-cluster webhook through them
                # (--enable-aggregator-routing: the pod's address, on the bridge, not a ClusterIP)
                "endpoints-controller",
                "endpointslice-controller",
                "root-ca-certificate-publisher-controller",  # kube-root-ca.crt, for projected tokens
            )
        )
        # No kube-proxy: one rule stands in for the kubernetes Service, and route_localnet lets a packet
        # from the bridge reach 127.0.0.1 (kubelet's KUBE-FIREWALL lets exactly DNAT'ed ones through).
        self._dnat = [
            "PREROUTING", "-d", f"{controlplane.KUBERNETES_SERVICE_IP}/32", "-p", "tcp", "--dport", "443",
            "-j", "DNAT", "--to-destination", f"127.0.0.1:{plane.api_port}",
            "-m", "comment", "--comment", _DNAT_COMMENT,
        ]  # fmt: skip
        _run("iptables", "-t", "nat", "-I", *self._dnat[:1], "1", *self._dnat[1:])  # first: ahead of any other
        localnet = pathlib.Path("/proc/sys/net/ipv4/conf/all/route_localnet")
        self._route_localnet = localnet.read_text().strip()
        localnet.write_text("1")

    def kubelet_config(self) -> dict[str, Any]:
        f = self._files
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,  # this host is cgroup v1 (hybrid): kubelet refuses that by default
            "cgroupDriver": "cgroupfs",  # no systemd here; containerd reports cgroupfs too
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "imageServiceEndpoint": f"unix://{self.socket}",
            "staticPodPath": str(self.workdir / "manifests"),
            "address": "127.0.0.1",
            "port": self._kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 0,
            "tlsCertFile": f["kubelet-serving.crt"],
            "tlsPrivateKeyFile": f["kubelet-serving.key"],
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": self.plane.ca_file},
            },
            "authorization": {"mode": "AlwaysAllow"},  # only the API server's client certificate gets in
            "failSwapOn": False,
            "resolvConf": "",  # pods get no DNS configuration from the host
            "clusterDNS": [],
            "serializeImagePulls": False,
            # Never collect our locally made images: nothing could pull them again.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "rotateCertificates": False,
            "serverTLSBootstrap": False,
            "syncFrequency": "5s",
            "fileCheckFrequency": "5s",
            "nodeStatusUpdateFrequency": "5s",
            "podPidsLimit": -1,
            "containerLogMaxSize": "10Mi",
        }

    def _start_kubelet(self) -> None:
        (self.workdir / "manifests").mkdir(exist_ok=True)
        self._kubelet_port = controlplane.free_port()
        config = self.workdir / "kubelet-config.yaml"
        config.write_text(yaml.safe_dump(self.kubelet_config()))
        kubeconfig = self.workdir / "kubelet.kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "e2e",
                            "cluster": {"server": self.plane.server, "certificate-authority": self.plane.ca_file},
                        }
                    ],
                    "users": [
                        {
                            "name": "kubelet",
                            "user": {
                                "client-certificate": self._files["kubelet-client.crt"],
                                "client-key": self._files["kubelet-client.key"],
                            },
                        }
                    ],
                    "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "kubelet"}}],
                    "current-context": "e2e",
                }
            )
        )
        self._kubelet_argv = [
            str(self.parts.k8s.path("kubelet")),
            f"--config={config}",
            f"--kubeconfig={kubeconfig}",
            f"--hostname-override={NODE_NAME}",
            f"--root-dir={KUBELET_ROOT}",
            "--v=2",
        ]
        self.start_kubelet()

    def start_kubelet(self, timeout: float = 120.0) -> None:
        """Start (or, after `stop_kubelet`, restart) kubelet and wait for the Node to be Ready."""
        self.kubelet = self.plane.spawn("kubelet", self._kubelet_argv)
        k8skit.wait_for(f"node {NODE_NAME} Ready", self._node_ready, timeout=timeout)

    def stop_kubelet(self) -> None:
        if self.kubelet is not None:
            self.plane.stop_process(self.kubelet)
            self.kubelet = None

    def _node_ready(self) -> bool:
        if self.kubelet.popen.poll() is not None:
            raise NodeUnavailable(f"kubelet exited with {self.kubelet.popen.returncode}:\n{self.kubelet.tail(40)}")
        status, body = controlplane._https_get(
            f"{self.plane.server}/api/v1/nodes/{NODE_NAME}", self.plane.ca_file, self.plane.admin_token
        )
        if status != 200:
            return False
        conditions = json.loads(body).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    # -- stop -------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Take everything down (safe to call on a node that started only in part)."""
        self.stop_kubelet()
        if self.socket.exists():
            self._stop_containers()
        if self.containerd is not None:
            self.plane.stop_process(self.containerd)
            self.containerd = None
        self._stop_shims()
        self.plane.stop()
        if self._dnat:
            _run("iptables", "-t", "nat", "-D", *self._dnat, check=False)
            self._dnat = []
        if self._route_localnet is not None:
            pathlib.Path("/proc/sys/net/ipv4/conf/all/route_localnet").write_text(self._route_localnet)
            self._route_localnet = None
        self._unmount_under((str(self.workdir), str(KUBELET_ROOT), "/run/containerd", "/run/netns"))
        netns = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
        for name in sorted(netns - self._netns_before):
            _run("ip", "netns", "delete", name, check=False)
        _run("ip", "link", "del", BRIDGE, check=False)
        shutil.rmtree(KUBELET_ROOT, ignore_errors=True)
        for directory in KUBELET_FIXED_DIRS:
            shutil.rmtree(directory, ignore_errors=True)
        if os.path.isdir("/run/containerd") and not _sockets_under("/run/containerd"):
            shutil.rmtree("/run/containerd", ignore_errors=True)
        _remove_kubelet_chains()
        _remove_kubepods_cgroups()
        for directory in CDI_DIRS:  # made for this node (a hostPath, a test's spec): removed if empty
            if directory not in self._cdi_dirs_before:
                try:
                    directory.rmdir()
                except OSError:
                    pass

    def _stop_containers(self) -> None:
        tasks = self.ctr("tasks", "ls", "-q", check=False).stdout.split()
        for task in tasks:
            self.ctr("tasks", "kill", "--signal", "SIGKILL", task, check=False)
        deadline = time.monotonic() + 10
        while tasks and time.monotonic() < deadline and self.ctr("tasks", "ls", "-q", check=False).stdout.split():
            time.sleep(0.3)
        for container in self.ctr("containers", "ls", "-q", check=False).stdout.split():
            self.ctr("tasks", "delete", "--force", container, check=False)
            self.ctr("containers", "delete", container, check=False)

    def _stop_shims(self) -> None:
        """containerd 2's shims (one per pod sandbox) outlive it: stop the ones serving this node."""
        shim = str(self.parts.node_dir / "containerd-shim-runc-v2")
        for entry in pathlib.Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].decode(errors="replace") == shim and str(self.socket).encode() in argv:
                try:
                    os.kill(int(entry.name), signal.SIGKILL)
                except ProcessLookupError:
                    pass

    @staticmethod
    def _unmount_under(prefixes: Sequence[str]) -> None:
        """Unmount (lazily, deepest first) every mount at or below one of `prefixes`."""
        mounts = []
        for line in pathlib.Path("/proc/mounts").read_text().splitlines():
            point = line.split()[1].replace("\\040", " ")
            if any(point == p or point.startswith(p.rstrip("/") + "/") for p in prefixes):
                mounts.append(point)
        for point in sorted(set(mounts), key=lambda p: -len(p)):
            _run("umount", "-l", point, check=False)

    def foreign_dials(self) -> list[str]:
        """Dials outside loopback and the pod CIDR (kubelet probes pods there) in every log."""
        return self.plane.foreign_dials(allowed=(self.pod_cidr,))


def _kubelet_running() -> bool:
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "kubelet":
                    return True
            except OSError:
                continue
    return False


def _kill_processes_under(directory: pathlib.Path) -> None:
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "exe").startswith(f"{directory}/"):
                    os.kill(int(entry.name), signal.SIGKILL)
            except OSError:  # gone meanwhile, or not ours to read
                continue


def _sockets_under(directory: str) -> bool:
    for root, _dirs, names in os.walk(directory):
        for name in names:
            try:
                if pathlib.Path(root, name).is_socket():
                    return True
            except OSError:
                continue
    return False


def _remove_kubelet_chains() -> None:
    """kubelet installs KUBE-FIREWALL (with INPUT/OUTPUT jumps), KUBE-KUBELET-CANARY and
    KUBE-IPTABLES-HINT in iptables and ip6tables, and leaves them when it stops."""
    for iptables in ("iptables", "ip6tables"):
        if shutil.which(iptables) is None:
            continue
        for chain in ("INPUT", "OUTPUT"):
            while _run(iptables, "-D", chain, "-j", "KUBE-FIREWALL", check=False).returncode == 0:
                pass
        for table in ("filter", "nat", "mangle"):
            for chain in _KUBELET_CHAINS:
                if _run(iptables, "-t", table, "-F", chain, check=False).returncode == 0:
                    _run(iptables, "-t", table, "-X", chain, check=False)


def _remove_kubepods_cgroups() -> None:
    """kubelet's cgroupfs driver makes kubepods/ (and burstable/, besteffort/) under every hierarchy and
    leaves them when it stops; empty once the pods are gone."""
    root = pathlib.Path("/sys/fs/cgroup")
    for kubepods in [*root.glob("*/kubepods"), root / "kubepods"]:
        if not kubepods.is_dir():
            continue
        for directory in sorted((p for p in kubepods.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            try:
                directory.rmdir()
            except OSError:
                pass
        try:
            kubepods.rmdir()
        except OSError:
            pass


def leftovers(node_dir: pathlib.Path) -> list[str]:
    """What a stopped node would have left on this machine (empty: the machine is as it was)."""
    found = []
    if KUBELET_ROOT.exists():
        found.append(f"{KUBELET_ROOT} exists")
    found += [f"{d} exists" for d in KUBELET_FIXED_DIRS if d.exists()]
    for line in pathlib.Path("/proc/mounts").read_text().splitlines():
        point = line.split()[1]
        if point.startswith((str(KUBELET_ROOT), "/run/containerd", "/run/netns/cni-")):
            found.append(f"mount {point}")
    if _run("ip", "link", "show", BRIDGE, check=False).returncode == 0:
        found.append(f"bridge {BRIDGE}")
    if _DNAT_COMMENT in _run("iptables", "-t", "nat", "-S", "PREROUTING", check=False).stdout:
        found.append("the DNAT rule to the API server")
    if "KUBE-FIREWALL" in _run("iptables", "-S", check=False).stdout:
        found.append("kubelet's KUBE-FIREWALL chain")
    found += [f"cgroup {p}" for p in pathlib.Path("/sys/fs/cgroup").glob("*/kubepods")]
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                exe = os.readlink(entry / "exe")
            except OSError:
                continue
            if exe.startswith(str(node_dir)) or exe.endswith("/kubelet"):
                found.append(f"process {entry.name} ({exe})")
    return found


def image_reference(tar: pathlib.Path) -> tuple[str, str]:
    """(repository, tag) of the image in a docker-archive tar, from its manifest.json."""
    import tarfile

    with tarfile.open(tar) as archive:
        member = archive.extractfile("manifest.json")
        if member is None:
            raise NodeUnavailable(f"{tar} has no manifest.json: not a docker-archive tar")
        (entry,) = json.load(member)
    repository, _, tag = entry["RepoTags"][0].rpartition(":")
    return repository, tag


class MockDriver:
    """A host driver directory laid out as NVIDIA's driver container lays it out (the chart's
    `devicePlugin.driverRoot`): usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 is the NVML built on
    go-nvml's mock GPUs, and gpuslice-mock/state.json its state (MIG layout, GPU processes, XIDs:
    e2e/nvml/main.go), which `set_state` rewrites atomically while pods read it."""

    MACHINE_ENV = "GPUSLICE_NVML_MOCK_MACHINE"
    STATE_ENV = "GPUSLICE_NVML_MOCK_STATE"

    def __init__(self, root: pathlib.Path, nvml_dir: pathlib.Path, *, machine: str = "dgxa100") -> None:
        self.root = root
        self.machine = machine
        lib = root / "usr/lib/x86_64-linux-gnu"
        lib.mkdir(parents=True, exist_ok=True)
        shutil.copy2(nvml_dir / "libnvidia-ml.so.1", lib / "libnvidia-ml.so.1")
        (root / "gpuslice-mock").mkdir(exist_ok=True)
        self.state_file = root / "gpuslice-mock" / "state.json"
        self.set_state({})

    def set_state(self, state: dict[str, Any]) -> None:
        temporary = self.state_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(state))
        temporary.rename(self.state_file)

    def env(self) -> list[dict[str, str]]:
        """The chart's `devicePlugin.extraEnv` naming the machine and the state file as the chart
        mounts the driver root (`devicePlugin.driverRoot`, at /driver-root)."""
        return [{"name": k, "value": v} for k, v in self._container_env("/driver-root/gpuslice-mock").items()]

    def _container_env(self, state_dir: str) -> dict[str, str]:
        return {self.MACHINE_ENV: self.machine, self.STATE_ENV: f"{state_dir}/state.json"}

    def host_env(self) -> dict[str, str]:
        """The same for a process on this host (LD_LIBRARY_PATH finds the library)."""
        return {
            "LD_LIBRARY_PATH": str(self.root / "usr/lib/x86_64-linux-gnu"),
            self.MACHINE_ENV: self.machine,
            self.STATE_ENV: str(self.state_file),
        }

    def gpus(self) -> list[dict[str, Any]]:
        """What the mock presents now, as our own discovery reads it through pynvml in a process of
        this host: [{uuid, index, minor, model, memory_mib, mig: [{uuid, profile}]}]."""
        program = (
            "import json; from gpuslice.node import nvml_source\n"
            "node = nvml_source.discover(nvml_source.load_pynvml())\n"
            "print(json.dumps([{'uuid': g.uuid, 'index': g.index, 'minor': g.minor_number, 'model': g.model,"
            " 'memory_mib': g.memory_mib, 'mig': [{'uuid': m.uuid, 'profile': m.profile} for m in g.mig]}"
            " for g in node.gpus]))"
        )
        done = subprocess.run(  # noqa: S603
            [sys.executable, "-c", program], env={**os.environ, **self.host_env()}, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise NodeUnavailable(f"the NVML mock does not answer: {done.stderr.strip()[-500:]}")
        gpus: list[dict[str, Any]] = json.loads(done.stdout)
        return gpus

    CDI_SPEC = pathlib.Path("/etc/cdi/gpuslice-e2e-nvidia.yaml")

    def publish_cdi_spec(self) -> None:
        """The spec of the GPUs the mock presents now (after `set_state`'s MIG layout) in /etc/cdi,
        where containerd (cdi-cri, DRA) and NVIDIA's runtime (RuntimeClass nvidia) read it."""
        self.write_cdi_spec(self.CDI_SPEC, self.root / "dev")

    def withdraw_cdi_spec(self) -> None:
        self.CDI_SPEC.unlink(missing_ok=True)

    def write_cdi_spec(self, path: pathlib.Path, devices: pathlib.Path) -> None:
        """A CDI specification for these GPUs shaped as `nvidia-ctk cdi generate --device-name-strategy
        uuid` writes one: a device per GPU and MIG device named by UUID, with its device node
        (/dev/nvidia<minor>; here a character device made as a copy of /dev/null under `devices`),
        and, for every container given any of them, /dev/nvidiactl and the driver's NVML library
        mounted where the container's loader finds it (nvidia-ctk mounts every driver library and
        runs hooks that update the loader cache; none of that is needed for NVML alone)."""
        devices.mkdir(parents=True, exist_ok=True)
        gpus = self.gpus()

        def node(name: str) -> dict[str, str]:
            host = devices / name
            if not host.exists():
                os.mknod(host, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
                host.chmod(0o666)
            return {"path": f"/dev/{name}", "hostPath": str(host)}

        entries = []
        for gpu in gpus:
            entries.append({"name": gpu["uuid"], "containerEdits": {"deviceNodes": [node(f"nvidia{gpu['minor']}")]}})
            for mig in gpu["mig"]:
                entries.append(
                    {"name": mig["uuid"], "containerEdits": {"deviceNodes": [node(f"nvidia{gpu['minor']}")]}}
                )
        entries.append({"name": "all", "containerEdits": {"deviceNodes": [node(f"nvidia{g['minor']}") for g in gpus]}})
        library = self.root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
        ro = ["ro", "nosuid", "nodev", "bind"]
        spec = {
            "cdiVersion": "0.6.0",
            "kind": "nvidia.com/gpu",
            "devices": entries,
            "containerEdits": {
                "deviceNodes": [node("nvidiactl")],
                # The mock's own settings travel with its library (a real driver needs neither).
                "env": [f"{name}={value}" for name, value in self._container_env("/gpuslice-mock").items()],
                "mounts": [
                    {
                        "hostPath": str(library),
                        "containerPath": "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                        "options": ro,
                    },
                    {"hostPath": str(self.state_file.parent), "containerPath": "/gpuslice-mock", "options": ro},
                ],
            },
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(spec))
