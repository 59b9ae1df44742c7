"""The node side of DRA mode for tests on the real control plane: draharness (kubelet's real DRA
manager and plugin manager, e2e/k8s/cmd/draharness) and our DRA plugin as a process registering
with it through the plugins_registry directory, as with a real kubelet.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any

import k8skit
import pytest

from gpuslice.sim import controlplane

BINARY = "draharness"


def binary_or_skip(plane: controlplane.ControlPlane) -> pathlib.Path:
    """draharness from the same build as the control plane (built by e2e/k8s/build.sh)."""
    path = plane.binaries.path(BINARY)
    if not os.access(path, os.X_OK):
        message = f"{path} is missing: e2e/k8s/build.sh builds it (an older build lacks it)"
        if os.environ.get(k8skit.REQUIRE_ENV) == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return path


class DraHarness:
    """draharness for one node: kubelet's DRA manager with a loopback test API."""

    def __init__(self, plane: controlplane.ControlPlane, node_name: str, name: str = "draharness") -> None:
        self.plane = plane
        self.node_name = node_name
        self.name = name
        self.binary = binary_or_skip(plane)
        # Unix socket paths are limited to 107 bytes: kubelet's directories live in a short root of their own.
        self.root = pathlib.Path(tempfile.mkdtemp(prefix="gs-kubelet-", dir="/tmp"))
        self.registry_dir = self.root / "plugins_registry"
        self.plugins_dir = self.root / "plugins"
        self.state_dir = self.root / "dra-manager"
        self.process: Any = None
        self.base = ""

    def start(self) -> DraHarness:
        port = k8skit.free_port()
        self.process = self.plane.spawn(
            self.name,
            [
                str(self.binary),
                f"--kubeconfig={self.plane.admin_kubeconfig}",
                f"--node-name={self.node_name}",
                f"--plugins-registry-dir={self.registry_dir}",
                f"--state-dir={self.state_dir}",
                f"--listen=127.0.0.1:{port}",
                "--v=4",
            ],
        )
        self.base = f"http://127.0.0.1:{port}"

        def listening() -> bool:
            if self.process.popen.poll() is not None:
                raise AssertionError(f"draharness exited ({self.process.popen.returncode}):\n{self.process.tail()}")
            try:
                return self._request("GET", "/healthz")[0] == 200
            except OSError:
                return False

        # It listens once kubelet's startup wipe of the node's ResourceSlices is done.
        k8skit.wait_for("draharness to listen", listening, timeout=60)
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.plane.stop_process(self.process)
            self.process = None

    def restart(self) -> None:
        """Kubelet restarts: same directories, the DRA manager starts again from its checkpoint."""
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def _request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 - loopback
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def driver_registered(self, driver: str) -> bool:
        """Kubelet's DRA manager knows a plugin of `driver` (it may be disconnected)."""
        return self._request("GET", f"/driver?name={driver}")[0] == 200

    def prepare(self, pod: Mapping[str, Any]) -> tuple[int, Any]:
        """Kubelet prepares a bound pod's claims: (200, CDI devices per container and claim) or (409, error)."""
        return self._request("POST", "/prepare", pod)

    def unprepare(self, pod: Mapping[str, Any]) -> tuple[int, Any]:
        """The pod has terminated: kubelet unprepares its claims. (204, None) or (409, error)."""
        return self._request("POST", "/unprepare", pod)


def start_dra_plugin(
    plane: controlplane.ControlPlane,
    harness: DraHarness,
    node_file: pathlib.Path,
    *,
    cdi_dir: pathlib.Path,
    state_dir: pathlib.Path,
    http_port: int,
    name: str = "dra-plugin",
    extra_args: Iterable[str] = (),
) -> Any:
    """gpuslice-dra-plugin on a node file, serving in the harness's kubelet plugins directories."""
    return plane.spawn(
        name,
        [
            sys.executable,
            "-m",
            "gpuslice.dra.main",
            f"--node-file={node_file}",
            f"--node-name={harness.node_name}",
            f"--kubelet-plugins-dir={harness.plugins_dir}",
            f"--kubelet-registry-dir={harness.registry_dir}",
            f"--cdi-dir={cdi_dir}",
            f"--state-dir={state_dir}",
            f"--http-port={http_port}",
            "--log-level=DEBUG",
            *extra_args,
        ],
        env={
            "PYTHONUNBUFFERED": "1",
            "KUBECONFIG": plane.admin_kubeconfig,
            "GPUSLICE_DRA_ENABLED": "true",
            # The chart's default resync (300 s): slices kubelet wipes when it restarts must come back
            # through the plugin's slice watch, within seconds.
            "GPUSLICE_DRA_SLICE_RESYNC_SECONDS": "300",
        },
    )
