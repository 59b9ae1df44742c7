"""migStrategy (none, single, mixed) on node files with GPUs in MIG mode: what is advertised,
and the layouts `single` refuses."""

from __future__ import annotations

import asyncio
import pathlib

import pytest
from kubelet_emulator import kubelet_fixture, socket_dir_fixture  # noqa: F401 - fixtures

from gpuslice import config, contract
from gpuslice.deviceplugin import main, manager
from gpuslice.node import health, inventory, migstrategy, nodefile

# tests/conftest.py has the same; a test module cannot import it (tests/e2e has a conftest too).
EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "gpuslice" / "examples"

pytestmark = pytest.mark.usefixtures("no_leftover_tasks")

A100 = "NVIDIA A100-SXM4-80GB"


def a100(index: int, profiles: list[str] | None) -> dict:
    """A node-file GPU entry: in MIG mode with one MIG device per profile (None: not in MIG mode)."""
    gpu: dict = {
        "uuid": f"GPU-{index:08d}-0000-0000-0000-000000000000",
        "model": A100,
        "memoryMiB": 81920,
        "index": index,
        "numaNode": index % 2,
    }
    if profiles is not None:
        memory = {"3g.40gb": 40192, "2g.20gb": 19968, "1g.10gb": 9728}
        gpu["mig"] = [
            {"uuid": f"MIG-{index:04d}{j:04d}-0000-0000-0000-000000000000", "profile": p, "memoryMiB": memory[p]}
            for j, p in enumerate(profiles)
        ]
    return gpu


def node(*gpus: dict) -> inventory.NodeInventory:
    return nodefile.parse({"gpus": list(gpus)}, source="test node")


UNIFORM = node(a100(0, ["3g.40gb", "3g.40gb"]), a100(1, ["3g.40gb", "3g.40gb"]))


def advertised(demo: inventory.NodeInventory, strategy: str) -> dict[str, int]:
    settings = config.Config(mig_strategy=strategy)
    resources = manager.build_resources(migstrategy.advertised(demo, strategy), settings)
    return {r.name: len(r.device_ids) for r in resources}


def test_mixed_is_the_default_and_keeps_each_profile_its_own_resource(demo_node):
    assert config.Config().mig_strategy == "mixed"
    assert advertised(demo_node, "mixed") == {
        "gpuslice.io/gpu-memory": 636,
        "gpuslice.io/mig-1g.10gb": 2,
        "gpuslice.io/mig-2g.20gb": 1,
        "gpuslice.io/mig-3g.40gb": 1,
    }


def test_none_advertises_no_mig_resource_and_leaves_out_gpus_in_mig_mode(demo_node):
    assert advertised(demo_node, "none") == {"gpuslice.io/gpu-memory": 636}
    assert [g.index for g in migstrategy.left_out(demo_node, "none")] == [2]
    assert migstrategy.left_out(demo_node, "mixed") == ()


def test_single_shares_each_mig_device_by_memory_units_as_the_plain_resource():
    assert advertised(UNIFORM, "single") == {"gpuslice.io/gpu-memory": 4 * (40192 // 256)}
    view = migstrategy.advertised(UNIFORM, "single")
    first = view.gpus[0]
    assert (first.uuid, first.memory_mib, first.parent_uuid) == (
        "MIG-00000000-0000-0000-0000-000000000000",
        40192,
        "GPU-00000000-0000-0000-0000-000000000000",
    )
    assert first.model == f"{A100} MIG 3g.40gb" and not first.mig_enabled
    assert [g.numa_node for g in view.gpus] == [0, 0, 1, 1]


def test_under_single_a_unit_fails_with_its_mig_device_and_with_the_gpu_holding_it():
    (memory,) = manager.build_resources(migstrategy.advertised(UNIFORM, "single"), config.Config(mig_strategy="single"))
    unit = contract.unit_device_id("MIG-00010000-0000-0000-0000-000000000000", 0, 256)
    assert memory.health_units[unit] == (
        "MIG-00010000-0000-0000-0000-000000000000",
        "GPU-00000001-0000-0000-0000-000000000000",
    )
    assert memory.numa_nodes[unit] == 1


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        ([a100(0, ["3g.40gb"]), a100(1, None)], "GPU 1 (GPU-00000001-0000-0000-0000-000000000000) is not in MIG mode"),
        ([a100(0, ["3g.40gb"]), a100(1, [])], "GPU 1 (GPU-00000001-0000-0000-0000-000000000000) has no MIG devices"),
        ([a100(0, ["3g.40gb"]), a100(1, ["2g.20gb", "1g.10gb"])], "1g.10gb (9728 MiB), 2g.20gb (19968 MiB), 3g.40gb"),
    ],
    ids=["a-gpu-not-in-mig-mode", "a-gpu-without-mig-devices", "more-than-one-profile"],
)
def test_single_refuses_a_node_that_is_not_uniform_naming_what_differs(gpus, message):
    with pytest.raises(migstrategy.MigStrategyError, match="migStrategy single needs") as error:
        migstrategy.advertised(node(*gpus), "single")
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_plugin_refuses_single_on_a_mixed_node_in_one_line_and_exits_2(tmp_path, capsys):

    argv = [
        "--node-file",
        str(EXAMPLES / "demo-node.yaml"),
        "--kubelet-dir",
        str(tmp_path),
        "--http-port",
        "0",
        "--mig-strategy",
        "single",
    ]
    assert main.main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("gpuslice-device-plugin: migStrategy single needs every GPU in MIG mode")
    assert "GPU 0 (GPU-21302f2a-76fb-5940-b684-dae50f92c162) is not in MIG mode" in line
    assert list(tmp_path.iterdir()) == []  # refused before anything was served


def test_an_unknown_strategy_is_a_configuration_error():
    with pytest.raises(config.ConfigError, match="migStrategy: must be one of none, single, mixed, got 'all'"):
        config.load(environ={"GPUSLICE_MIG_STRATEGY": "all"})


def test_single_cannot_be_combined_with_mps(tmp_path):
    settings = config.Config(mig_strategy="single", mps=config.MpsConfig(enabled=True))
    options = main.Options(kubelet_dir=str(tmp_path), pod_resources_socket=str(tmp_path / "pr.sock"), http_port=0)
    with pytest.raises(main.startup.StartupError, match="mps.enabled cannot be used with migStrategy single"):
        asyncio.run(main.run(settings, options, UNIFORM, stop=asyncio.Event()))


async def test_under_single_kubelet_gets_units_of_mig_devices_and_the_container_its_mig_device(kubelet, socket_dir):
    settings = config.Config(mig_strategy="single")
    options = main.Options(
        kubelet_dir=str(socket_dir),
        pod_resources_socket=str(kubelet.pod_resources_socket),
        http_port=0,
        poll_interval=0.05,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(main.run(settings, options, UNIFORM, stop=stop), name="plugin-under-test")
    try:
        await kubelet.wait_for_resource("gpuslice.io/gpu-memory", 4 * 157)
        assert [r.resource_name for r in kubelet.registrations] == ["gpuslice.io/gpu-memory"]
        answer = await kubelet.allocate("gpuslice.io/gpu-memory", 80, "ns/p/c")  # half a 3g.40gb
        envs = answer.container_responses[0].envs
        assert envs["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
        assert envs["GPUSLICE_MEMORY_LIMIT_MIB"] == str(80 * 256)
    finally:
        stop.set()
        assert await task == 0


def test_health_of_the_physical_gpu_reaches_the_units_of_its_mig_devices():
    state = health.HealthState()
    state.mark_unhealthy("GPU-00000000-0000-0000-0000-000000000000", "XID 79")
    (memory,) = manager.build_resources(migstrategy.advertised(UNIFORM, "single"), config.Config(mig_strategy="single"))
    sick = {d for d, units in memory.health_units.items() if set(units) & set(state.unhealthy)}
    assert {contract.parse_unit_device_id(d).gpu_uuid for d in sick} == {
        "MIG-00000000-0000-0000-0000-000000000000",
        "MIG-00000001-0000-0000-0000-000000000000",
    }
