"""`make demo`: the real plugin (gRPC, kubelet emulator) and webhook (HTTPS) on the demo node."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import tempfile

import yaml

from gpuslice import config
from gpuslice.demo import main as demo
from gpuslice.demo import pods as demo_pods
from gpuslice.node import inventory


def _leftovers() -> set[str]:
    return {p.name for p in pathlib.Path(tempfile.gettempdir()).glob("gpuslice-demo-*")} | {
        p.name for p in pathlib.Path("/tmp").glob("gpuslice-demo-*")
    }


async def test_every_demo_pod_lands_on_a_gpu_with_its_memory_and_environment(
    demo_node: inventory.NodeInventory,
) -> None:
    before = _leftovers()
    report = await demo.run_demo(config.Config(), demo_node)
    by_name = {p.name: p for p in report.pods}

    half = by_name["default/gpu-sharing-fraction"]
    assert half.request.startswith("gpuslice.io/gpu-memory: 159")
    assert half.where == "GPU 0 (NVIDIA H100 80GB HBM3)" and half.memory_mib == 159 * 256
    assert half.env["NVIDIA_VISIBLE_DEVICES"] == demo_node.gpus[0].uuid
    assert half.env["GPUSLICE_MEMORY_LIMIT_MIB"] == "40704"

    kai = by_name["gpu-workload/gpu-pod"]
    assert kai.memory_mib == 2048
    assert any("kai-scheduler" in w for w in kai.warnings)
    # KAI's shape: the annotation alone, kai-scheduler rewritten; every such pod placed.
    for pod in yaml.safe_load_all(demo_pods.KAI_EXAMPLE_MANIFEST):
        shown = by_name[f"{pod['metadata'].get('namespace', 'default')}/{pod['metadata']['name']}"]
        assert shown.gpus and any("kai-scheduler" in w for w in shown.warnings), shown.name

    # The placeholder form is accepted too: the nvidia.com/gpu: 1 beside the share is removed.
    placeholder = by_name["default/gpu-placeholder"]
    assert "nvidia.com/gpu: 1" in placeholder.asked
    assert placeholder.request.startswith("gpuslice.io/gpu-memory: 8")
    assert placeholder.request.endswith("the nvidia.com/gpu placeholder removed")
    assert placeholder.memory_mib == 2048 and placeholder.gpus

    mig = by_name["default/isolated-tenant"]
    assert mig.where.startswith("MIG 1g.10gb on GPU 2")
    assert mig.env["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")

    typo = by_name["default/typo"]
    assert "gpu-fraction='1.5' is above 1" in typo.denied and not typo.gpus

    etl = by_name["default/etl-batch"]  # asks for no GPU: steered, placed, holds no GPU
    assert "prefers nodes where gpu.free-gpus DoesNotExist or gpu.free-gpus Lt 1" in etl.request
    assert etl.node == "demo-node" and not etl.gpus

    assert len(report.placed) == 7
    assert report.gpus_used == 3
    assert _leftovers() == before


def test_the_rendered_report_has_the_lines_a_person_looks_for(demo_node: inventory.NodeInventory) -> None:
    report = demo.Report(
        node_summary="GPU 0 test",
        plugin_resources={"gpuslice.io/gpu-memory": 636},
        webhook_url="https://127.0.0.1:1/mutate",
        pods=[
            demo.PodResult(
                name="default/a",
                asked="gpu-fraction=0.5",
                request="gpuslice.io/gpu-memory: 159",
                node="demo-node",
                gpus=("GPU-x",),
                where="GPU 0 (H100)",
                memory_mib=40704,
                env={"NVIDIA_VISIBLE_DEVICES": "GPU-x"},
            ),
            demo.PodResult(name="default/b", asked="gpu-fraction=0.25", gpus=("GPU-x",), where="GPU 0 (H100)"),
            demo.PodResult(
                name="default/typo", asked="gpu-fraction=1.5", denied="annotation gpu-fraction='1.5' is above 1"
            ),
            demo.PodResult(name="default/etl", asked="no annotations", request="no GPU resource", node="demo-node"),
        ],
    )
    text = report.render()
    assert "placed on demo-node, no GPU" in text
    assert "placed on demo-node, GPU 0 (H100): 40704 MiB" in text
    assert "env: NVIDIA_VISIBLE_DEVICES=GPU-x" in text
    assert "DENIED by the webhook: annotation gpu-fraction='1.5' is above 1" in text
    assert "2 GPU pods on 1 physical GPU: 1 GPU saved against one pod per GPU" in text


def test_gpuslice_demo_runs_as_a_command_and_leaves_nothing_behind() -> None:
    before = _leftovers()
    done = subprocess.run(
        [sys.executable, "-m", "gpuslice.demo.main"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "7 GPU pods on 3 physical GPUs: 4 GPUs saved against one pod per GPU" in done.stdout
    assert "the nvidia.com/gpu placeholder removed" in done.stdout
    assert "DENIED by the webhook" in done.stdout
    assert _leftovers() == before


def test_a_bad_node_file_is_refused_with_its_name(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "node.yaml"
    bad.write_text("gpus: nope\n")
    done = subprocess.run(
        [sys.executable, "-m", "gpuslice.demo.main", "--node-file", str(bad)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert str(bad) in done.stderr
