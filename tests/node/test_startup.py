"""Start-up bounds of the node side (issue 13.7): what kubelet cannot take is refused at start, and
every start-up error is one line and exit status 2, never a traceback."""

from __future__ import annotations

import pathlib
import socket
import subprocess
import sys

import pytest

from gpuslice import config
from gpuslice.deviceplugin import main, manager, server
from gpuslice.dra import main as dra_main
from gpuslice.node import health, metrics, nodefile, startup

REPO = pathlib.Path(__file__).resolve().parents[2]
H200_NODE = REPO / "gpuslice" / "examples" / "h200x8-node.yaml"
DEMO_NODE = REPO / "gpuslice" / "examples" / "demo-node.yaml"


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


# --- kubelet's 4 MiB ListAndWatch limit -------------------------------------------------------


@pytest.mark.parametrize("unit_mib", [256, 64, 16, 7])
def test_the_size_bound_is_the_size_of_the_message_kubelet_receives(h200_node, unit_mib):
    """The bound is computed without building the device list; it must equal the real message
    with every device unhealthy (the longer health string)."""
    settings = config.load(environ={}, overrides={"memoryUnitMiB": unit_mib})
    state = health.HealthState()
    state.mark_unhealthy(health.ALL, "test: the larger message")
    memory = manager.build_resources(h200_node, settings)[0]
    plugin = server.PluginServer(
        memory, socket_dir="/nonexistent", health_state=state, plugin_metrics=metrics.Metrics()
    )
    message, unhealthy = plugin.snapshot()
    assert len(unhealthy) == len(memory.device_ids)
    assert startup.list_and_watch_bytes(h200_node, unit_mib) == message.ByteSize()


def test_a_unit_size_past_kubelets_message_limit_is_refused_naming_the_smallest_that_fits(h200_node, capsys):
    status = main.main(["--node-file", str(H200_NODE), "--kubelet-dir", "/nonexistent", "--memory-unit-mib", "16"])
    assert status == 2
    line = one_line(capsys.readouterr().err)
    assert "71,880 devices of 16 MiB" in line and "gRPC limit of 4 MiB" in line
    assert "the smallest memoryUnitMiB for this node is 20" in line
    assert "at most" in line  # the largest GPU memory that fits at the configured size
    limit = startup.KUBELET_MAX_MESSAGE_BYTES
    assert startup.list_and_watch_bytes(h200_node, 20) <= limit < startup.list_and_watch_bytes(h200_node, 19)


def test_the_default_unit_size_fits_the_largest_example_node(h200_node):
    startup.check_device_list(h200_node, config.Config().contract)


def test_absurd_node_file_memory_is_refused_naming_the_largest_allowed(tmp_path, capsys):
    node_file = tmp_path / "node.yaml"
    node_file.write_text("gpus: [{uuid: GPU-1, model: X, index: 0, memoryMiB: 81559000000}]\n")
    assert main.main(["--node-file", str(node_file), "--kubelet-dir", str(tmp_path), "--http-port", "0"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "memoryMiB 81559000000 is more than any GPU has; the largest allowed is 1048576" in line


def test_many_large_gpus_within_the_file_bound_are_still_refused_by_the_message_bound(tmp_path, capsys):
    largest = nodefile.MAX_GPU_MEMORY_MIB
    gpus = ", ".join(
        f"{{uuid: GPU-{i:08d}-0000-4000-8000-000000000000, model: X, index: {i}, memoryMiB: {largest}}}"
        for i in range(16)
    )
    node_file = tmp_path / "node.yaml"
    node_file.write_text(f"gpus: [{gpus}]\n")
    assert main.main(["--node-file", str(node_file), "--kubelet-dir", str(tmp_path), "--http-port", "0"]) == 2
    assert "over kubelet's gRPC limit of 4 MiB" in one_line(capsys.readouterr().err)


def test_a_gpu_uuid_too_long_for_a_device_id_is_one_line(tmp_path, capsys):
    node_file = tmp_path / "node.yaml"
    node_file.write_text(f"gpus: [{{uuid: GPU-{'x' * 60}, model: X, index: 0, memoryMiB: 1024}}]\n")
    assert main.main(["--node-file", str(node_file), "--kubelet-dir", str(tmp_path), "--http-port", "0"]) == 2
    assert "kubelet allows 63" in one_line(capsys.readouterr().err)


# --- start-up failures are one line, exit 2 -------------------------------------------------------


@pytest.fixture
def busy_port():
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        yield taken.getsockname()[1]


def test_the_device_plugin_on_a_port_in_use_says_so_in_one_line(tmp_path, busy_port, capsys):
    argv = ["--node-file", str(DEMO_NODE), "--kubelet-dir", str(tmp_path), "--http-port", str(busy_port)]
    assert main.main(argv) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("gpuslice-device-plugin: cannot start serving") and "address already in use" in line
    assert list(tmp_path.iterdir()) == []  # nothing left behind


def test_the_device_plugin_with_a_kubelet_dir_it_cannot_create_says_so_in_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    argv = ["--node-file", str(DEMO_NODE), "--kubelet-dir", str(blocker / "device-plugins"), "--http-port", "0"]
    assert main.main(argv) == 2
    assert "cannot start serving" in one_line(capsys.readouterr().err)


def test_the_dra_plugin_on_a_port_in_use_says_so_in_one_line(tmp_path, busy_port, capsys):
    argv = [
        "--node-file",
        str(DEMO_NODE),
        "--node-name",
        "node-a",
        "--kubelet-plugins-dir",
        str(tmp_path / "plugins"),
        "--kubelet-registry-dir",
        str(tmp_path / "registry"),
        "--cdi-dir",
        str(tmp_path / "cdi"),
        "--http-port",
        str(busy_port),
    ]
    assert dra_main.main(argv) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("gpuslice-dra-plugin: cannot start serving") and "address already in use" in line


@pytest.mark.parametrize(
    "command", ["gpuslice.deviceplugin.main", "gpuslice.dra.main"], ids=["device-plugin", "dra-plugin"]
)
def test_a_reserved_resource_prefix_is_one_line_from_each_node_command(command, tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            command,
            "--node-file",
            str(DEMO_NODE),
            "--node-name",
            "n",
            "--resource-prefix",
            "kubernetes.io",
            "--http-port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "resourcePrefix: 'kubernetes.io' is in the kubernetes.io domain" in one_line(result.stderr)
