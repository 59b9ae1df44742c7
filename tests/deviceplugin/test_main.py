"""The whole device plugin (deviceplugin/main.py): its HTTP endpoints (/healthz, /readyz,
/metrics), the steering labels it keeps current and withdraws, SIGTERM, and the command line."""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import subprocess
import sys

import aiohttp
import pytest
from devicepluginkit import free_port
from kubelet_emulator import kubelet_fixture, socket_dir_fixture  # noqa: F401 - fixtures

from gpuslice import config
from gpuslice.deviceplugin import main

pytestmark = pytest.mark.usefixtures("no_leftover_tasks")

REPO = pathlib.Path(__file__).resolve().parents[2]
DEMO_NODE = REPO / "gpuslice" / "examples" / "demo-node.yaml"


# --- HTTP: /healthz, /readyz, /metrics -------------------------------------------------------


async def test_http_endpoints_report_liveness_readiness_and_metrics(kubelet, socket_dir, demo_node):
    port = free_port()
    options = main.Options(
        kubelet_dir=str(socket_dir),
        pod_resources_socket=str(kubelet.pod_resources_socket),
        http_port=port,
        poll_interval=0.05,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(main.run(config.Config(), options, demo_node, stop=stop), name="plugin-under-test")
    try:
        await kubelet.wait_until(lambda: len(kubelet.registrations) == 4)
        await kubelet.wait_for_resource("gpuslice.io/gpu-memory", 636)
        await kubelet.allocate("gpuslice.io/gpu-memory", 3, "ns/p/c")
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/healthz") as r:
                assert r.status == 200
            for _ in range(100):
                async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
                    if r.status == 200:
                        break
                await asyncio.sleep(0.02)
            assert r.status == 200
            async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
                text = await r.text()
        assert 'gpuslice_devices{health="Healthy",resource="gpuslice.io/gpu-memory"} 636.0' in text
        assert 'gpuslice_allocate_requests_total{resource="gpuslice.io/gpu-memory",result="ok"} 1.0' in text
        assert 'gpuslice_registrations_total{resource="gpuslice.io/mig-1g.10gb",result="ok"} 1.0' in text
    finally:
        stop.set()
        assert await task == 0
    assert [p.name for p in socket_dir.iterdir()] == ["kubelet.sock"]


async def test_readyz_is_503_until_kubelet_has_every_resource(socket_dir, demo_node):
    port = free_port()
    socket_dir.mkdir(parents=True)
    options = main.Options(
        kubelet_dir=str(socket_dir),
        pod_resources_socket=str(socket_dir / "no-pod-resources.sock"),
        http_port=port,
        poll_interval=0.05,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(main.run(config.Config(), options, demo_node, stop=stop), name="plugin-under-test")
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(100):
                try:
                    async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
                        status, text = r.status, await r.text()
                    break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.02)
        assert status == 503
        assert "not registered with kubelet: gpuslice.io/gpu-memory" in text
    finally:
        stop.set()
        assert await task == 0


class RecordingNodeApi:
    def __init__(self) -> None:
        self.patches: list[dict[str, str | None]] = []
        self.changed = asyncio.Event()

    async def patch_labels(self, node_name: str, labels: dict[str, str | None]) -> None:
        assert node_name == "node-a"
        self.patches.append(labels)
        self.changed.set()


async def test_with_a_node_name_the_plugin_keeps_its_steering_labels_current(kubelet, socket_dir, demo_node):
    settings = config.load(environ={}, overrides={"steering.labelMinIntervalSeconds": 0.01})
    options = main.Options(
        kubelet_dir=str(socket_dir),
        http_port=0,
        poll_interval=0.05,
        node_name="node-a",
        pod_resources_socket=str(kubelet.pod_resources_socket),
    )
    api = RecordingNodeApi()
    stop = asyncio.Event()
    task = asyncio.create_task(
        main.run(settings, options, demo_node, stop=stop, node_api=api), name="plugin-under-test"
    )
    free_units = "gpuslice.io/gpu.free-units"
    try:
        await kubelet.wait_for_resource("gpuslice.io/gpu-memory", 636)

        async def label_is(value: str) -> None:
            while not any(p.get(free_units) == value for p in api.patches):
                api.changed.clear()
                await api.changed.wait()

        await asyncio.wait_for(label_is("636"), 10)
        await kubelet.allocate("gpuslice.io/gpu-memory", 36, "ns/p/c")  # Allocate -> notify -> re-read kubelet
        await asyncio.wait_for(label_is("600"), 10)
    finally:
        stop.set()
        assert await task == 0
    # a stopped plugin takes its labels with it, totals and free counts in one patch
    published = {k for p in api.patches[:-1] for k in p}
    assert api.patches[-1].keys() >= published and set(api.patches[-1].values()) == {None}


# --- the command line ------------------------------------------------------------------------

PLUGIN = [sys.executable, "-m", "gpuslice.deviceplugin.main"]


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--memory-unit-mib", "0"], {}, "memoryUnitMiB: must be greater than 0, got 0"),
        (["--device-list-strategy", "volume-mounts"], {}, "deviceListStrategy: must be one of envvar, cdi-cri"),
        ([], {"GPUSLICE_MPS_ENABLED": "maybe"}, "mps.enabled: must be true or false"),
        (["--http-port", "70000"], {}, "--http-port must be 0..65535"),
    ],
    ids=["unit-zero", "unknown-strategy", "bad-env-bool", "bad-port"],
)
def test_configuration_errors_print_one_line_and_exit_2(args, env, message, tmp_path, capsys, monkeypatch):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit_:
        main.main(["--node-file", str(DEMO_NODE), "--kubelet-dir", str(tmp_path), *args])
    assert exit_.value.code == 2
    stderr = capsys.readouterr().err
    assert message in stderr
    assert len(stderr.strip().splitlines()) == 1


def test_the_installed_command_exits_2_on_a_configuration_file_error(tmp_path):
    settings = tmp_path / "gpuslice.yaml"
    settings.write_text("version: v1\nmemoryUnitMb: 512\n")
    result = subprocess.run(
        [*PLUGIN, "--config", str(settings), "--node-file", str(DEMO_NODE), "--kubelet-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "memoryUnitMb: unknown key (did you mean memoryUnitMiB?)" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpus: [{uuid: GPU-1, model: X, index: 0}]", "missing required key 'memoryMiB'"),
        ("gpus: {}", "must be a mapping with a list under 'gpus'"),
        ("gpus: [", "is not valid YAML"),
        (
            "gpus: [{uuid: GPU-1, model: X, index: 0, memoryMiB: 10, mig: [{uuid: M, profile: huge, memoryMiB: 1}]}]",
            "profile 'huge' is not a MIG profile",
        ),
    ],
    ids=["missing-key", "not-a-list", "bad-yaml", "bad-profile"],
)
def test_a_malformed_node_file_is_named_and_exits_2(text, message, tmp_path, capsys):
    node_file = tmp_path / "node.yaml"
    node_file.write_text(text)
    assert main.main(["--node-file", str(node_file), "--kubelet-dir", str(tmp_path), "--http-port", "0"]) == 2
    stderr = capsys.readouterr().err
    assert "node file error" in stderr and message in stderr and str(node_file) in stderr
    assert list(tmp_path.iterdir()) == [node_file]  # nothing served


async def test_sigterm_stops_a_real_plugin_process_and_removes_its_sockets(kubelet, socket_dir):
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpuslice.deviceplugin.main",
        "--node-file",
        str(DEMO_NODE),
        "--kubelet-dir",
        str(socket_dir),
        "--http-port",
        "0",
        "--node-name",
        "node-a",
        "--pod-resources-socket",
        str(kubelet.pod_resources_socket),  # labeller reads it; no API server: writes fail
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        await kubelet.wait_until(lambda: len(kubelet.registrations) == 4, timeout=30)
        await kubelet.wait_for_resource("gpuslice.io/gpu-memory", 636)
        await kubelet.allocate("gpuslice.io/gpu-memory", 4, "ns/p/c")
        process.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(process.communicate(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, output.decode()
    assert [p.name for p in socket_dir.iterdir()] == ["kubelet.sock"]
    assert b"removing plugin sockets" in output
    await kubelet.wait_until(lambda: kubelet.resources["gpuslice.io/gpu-memory"].allocatable == 0)


async def test_sigterm_removes_the_labels_the_plugin_published(kubelet, socket_dir, aiohttp_server, tmp_path):
    from aiohttp import web
    from labellerkit import NODE, OPERATOR_LABEL, FakeApiServer

    fake = FakeApiServer()
    app = web.Application()
    app.router.add_patch("/api/v1/nodes/{name}", fake.patch_node)
    server = await aiohttp_server(app, host="127.0.0.1")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
        f"clusters: [{{name: fake, cluster: {{server: 'http://127.0.0.1:{server.port}'}}}}]\n"
        "users: [{name: fake, user: {token: fake}}]\n"
        "contexts: [{name: fake, context: {cluster: fake, user: fake}}]\n"
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpuslice.deviceplugin.main",
        "--node-file",
        str(DEMO_NODE),
        "--kubelet-dir",
        str(socket_dir),
        "--http-port",
        "0",
        "--node-name",
        NODE,
        "--pod-resources-socket",
        str(kubelet.pod_resources_socket),
        env={**os.environ, "KUBECONFIG": str(kubeconfig), "KUBERNETES_SERVICE_HOST": ""},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    free_units = "gpuslice.io/gpu.free-units"
    try:
        await kubelet.wait_for_resource("gpuslice.io/gpu-memory", 636, timeout=30)

        async def labelled() -> None:
            while free_units not in fake.labels:
                await asyncio.sleep(0.05)

        await asyncio.wait_for(labelled(), 30)
        process.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(process.communicate(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, output.decode()
    assert fake.labels == {OPERATOR_LABEL: "true"}, output.decode()
