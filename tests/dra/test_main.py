"""`gpuslice-dra-plugin` (dra/main.py): the whole plugin against an in-memory API server (sockets,
slices, HTTP, prepare, a SIGTERM-like stop, a damaged checkpoint, the steering labels from the
claims it prepared), and its command line (`--print-resource-slices`, configuration errors)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import aiohttp
import chartkit
import dra_kit
import pytest
import yaml
from dra_kit import by_name, claim, dirs_fixture, result, uid  # noqa: F401 - fixture

from gpuslice import config
from gpuslice.dra import main
from gpuslice.node import nodefile

pytestmark = pytest.mark.usefixtures("no_leftover_tasks")

KUBE = "1.37.0"
SHARE_ID = "eeeeeeee-2222-4333-8444-555555555555"


# --- the whole plugin ---------------------------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def plugin_options(dirs, http_port: int) -> main.Options:  # type: ignore[no-untyped-def]
    return main.Options(
        node_name="node-a",
        plugins_dir=str(dirs["plugins"]),
        registry_dir=str(dirs["registry"]),
        cdi_dir=str(dirs["cdi"]),
        state_dir=str(dirs["state"]),
        http_port=http_port,
    )


async def test_the_plugin_serves_publishes_prepares_and_stops_cleanly(demo_node, dirs):
    api = dra_kit.FakeApi()
    share = claim(uid(5), [result("gpu", "gpu-0", "2Gi", share_id=SHARE_ID)])
    api.add_claim(share)
    port = free_port()
    options = plugin_options(dirs, port)
    settings = config.load(overrides={"dra.sliceMinIntervalSeconds": 0.05}, environ={})
    stop = asyncio.Event()
    task = asyncio.create_task(main.run(settings, options, demo_node, stop=stop, api=api), name="dra-plugin-under-test")
    socket = dirs["plugins"] / "gpu.gpuslice.io" / "dra.sock"
    try:
        for _ in range(200):
            if (dirs["registry"] / "gpu.gpuslice.io-reg.sock").exists() and api.slices:
                break
            await asyncio.sleep(0.02)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
                assert response.status == 503 and "kubelet registration" in await response.text()
            await dra_kit.register_like_kubelet(dirs["registry"])
            async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
                assert response.status == 200, await response.text()
            assert [s["spec"]["pool"]["generation"] for s in api.slices.values()] == [1]
            answer = await dra_kit.prepare(socket, [share])
            assert answer.claims[uid(5)].devices[0].share_id == SHARE_ID
            async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                text = await response.text()
            assert 'gpuslice_dra_calls_total{call="prepare",result="ok"} 1.0' in text
            assert "gpuslice_dra_prepared_claims 1.0" in text
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 10) == 0
    assert not socket.exists() and not (dirs["registry"] / "gpu.gpuslice.io-reg.sock").exists()
    assert (dirs["state"] / "checkpoint.json").exists()


async def test_the_plugin_refuses_to_start_on_a_damaged_checkpoint(demo_node, dirs):
    dirs["state"].mkdir(parents=True)
    (dirs["state"] / "checkpoint.json").write_text("{damaged")
    options = plugin_options(dirs, 0)
    assert await main.run(config.Config(), options, demo_node, stop=asyncio.Event(), api=dra_kit.FakeApi()) == 2
    assert not (dirs["registry"]).exists() or list(dirs["registry"].iterdir()) == []


class RecordingNodeApi:
    """The steering labeller's NodeApi: the merged labels of node-a as the API server would hold them."""

    def __init__(self) -> None:
        self.labels: dict[str, str] = {}
        self.changed = asyncio.Event()

    async def patch_labels(self, node_name: str, labels: dict[str, str | None]) -> None:
        assert node_name == "node-a"
        for key, value in labels.items():
            if value is None:
                self.labels.pop(key, None)
            else:
                self.labels[key] = value
        self.changed.set()

    async def until(self, check) -> None:  # type: ignore[no-untyped-def]
        while not check(self.labels):
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), 5)


async def test_the_plugin_publishes_steering_labels_from_the_claims_it_prepared_and_withdraws_them(demo_node, dirs):
    contract = config.Config().contract
    api = dra_kit.FakeApi()
    share = claim(uid(6), [result("gpu", "gpu-0", "2Gi", share_id=SHARE_ID)])
    api.add_claim(share)
    node_api = RecordingNodeApi()
    options = plugin_options(dirs, 0)
    settings = config.load(overrides={"steering.labelMinIntervalSeconds": 0.01}, environ={})
    stop = asyncio.Event()
    task = asyncio.create_task(main.run(settings, options, demo_node, stop=stop, api=api, node_api=node_api))
    socket = dirs["plugins"] / "gpu.gpuslice.io" / "dra.sock"
    try:
        await node_api.until(lambda labels: contract.label_free_units in labels)
        free_before = int(node_api.labels[contract.label_free_units])
        whole_gpus = int(node_api.labels[contract.label_free_gpus])
        for _ in range(200):
            if socket.exists():
                break
            await asyncio.sleep(0.02)
        await dra_kit.prepare(socket, [share])
        # 2 GiB of gpu-0 at 256 MiB units: 8 units fewer, and gpu-0 is no longer whole.
        await node_api.until(lambda labels: int(labels[contract.label_free_units]) == free_before - 8)
        assert int(node_api.labels[contract.label_free_gpus]) == whole_gpus - 1
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 10) == 0
    assert node_api.labels == {}, node_api.labels  # withdrawn at exit


# --- the command line ---------------------------------------------------------------------------------


def test_print_resource_slices_prints_valid_yaml_without_a_cluster(tmp_path, capsys):
    node_file = tmp_path / "node.yaml"
    node_file.write_text(nodefile.dump(nodefile.load(chartkit.REPO / "gpuslice" / "examples" / "demo-node.yaml")))
    assert main.main(["--node-file", str(node_file), "--print-resource-slices", "--node-name", "gpu-7"]) == 0
    objs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [o["metadata"]["name"] for o in objs] == ["gpu-7-gpu.gpuslice.io-0"]
    assert all(chartkit.schema_errors(o, KUBE) == [] for o in objs)
    assert len(objs[0]["spec"]["devices"]) == 6


def test_print_resource_slices_runs_as_the_console_script():
    node = chartkit.REPO / "gpuslice" / "examples" / "h200x8-node.yaml"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuslice.dra.main",
            "--node-file",
            str(node),
            "--print-resource-slices",
            "--memory-unit-mib",
            "1024",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    devices = by_name(yaml.safe_load_all(done.stdout))
    assert len(devices) == 8
    assert devices["gpu-3"]["capacity"]["gpu.gpuslice.io/memory"]["requestPolicy"]["validRange"]["step"] == "1024Mi"


def test_a_prefix_too_long_for_a_driver_name_is_a_configuration_error(capsys):
    long_prefix = "a-very-long-prefix-that-goes-on-and-on-and-on-forever.example.com"
    with pytest.raises(SystemExit) as stopped:
        main.parse_args(["--print-resource-slices", "--resource-prefix", long_prefix])
    assert stopped.value.code == 2
    assert "allows 63 (shorten resourcePrefix)" in capsys.readouterr().err


def test_without_a_node_name_only_printing_is_allowed(capsys, monkeypatch):
    monkeypatch.delenv("NODE_NAME", raising=False)
    with pytest.raises(SystemExit):
        main.parse_args([])
    assert "--node-name" in capsys.readouterr().err
    settings, options, _ = main.parse_args(["--print-resource-slices"])
    assert options.print_resource_slices and settings == config.Config()
