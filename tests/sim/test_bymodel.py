"""`python -m gpuslice.sim.bymodel`: a replay's CPU and GPUs by node model, from its placements file."""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest

from gpuslice.sim import bymodel, placements, trace
from gpuslice.sim import main as sim_main

TINY = pathlib.Path(__file__).parents[1] / "data" / "trace"


@pytest.fixture
def replayed(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> tuple[pathlib.Path, pathlib.Path]:
    """(a placements file of the tiny trace at 130 %, a trace folder holding its node and pod files)."""
    folder = tmp_path / "trace"
    folder.mkdir()
    shutil.copy(TINY / "tiny_nodes.csv", folder / trace.DEFAULT_NODE_FILE)
    shutil.copy(TINY / "tiny_pods.csv", folder / "tiny_pods.csv")
    target = tmp_path / "placements.jsonl"
    flags = ["--nodes", str(folder / trace.DEFAULT_NODE_FILE), "--pods", str(folder / "tiny_pods.csv")]
    assert sim_main.main([*flags, "--demand", "1.3", "--json", "--placements", str(target)]) == 0
    capsys.readouterr()
    return target, folder


def test_the_rows_add_up_to_the_replays_own_figures(replayed: tuple[pathlib.Path, pathlib.Path]) -> None:
    target, folder = replayed
    nodes = trace.load_nodes(folder / trace.DEFAULT_NODE_FILE)
    pods = {p.name: p for p in trace.load_pods(folder / "tiny_pods.csv")}
    lines = target.read_text().splitlines()
    result = bymodel.breakdown(lines, nodes, pods)
    runs = {(r["configuration"], r["seed"]): r for r in map(json.loads, lines) if r["record"] == "run"}
    assert set(result) == set(runs)
    copies = 0
    for key, rows in result.items():
        run = runs[key]
        placed = [p for p in map(json.loads, lines) if p["record"] == "pod" and p["outcome"] == "placed"]
        placed = [p for p in placed if (p["configuration"], p["seed"]) == key]
        copies += sum("-r" in p["pod"] for p in placed)
        assert sum(r.gpus for r in rows) == run["total_gpus"] == sum(n.gpus for n in nodes)
        assert sum(r.pods.total() for r in rows) == len(placed)
        granted = sum(r.granted_gpus for r in rows) / run["total_gpus"]
        assert granted == pytest.approx(run["gpu_allocation_ratio"], abs=1e-9)
        held = {g["uuid"] for p in placed for g in p["gpus"]}
        assert sum(r.idle_gpus for r in rows) == run["total_gpus"] - len(held)
        asked = sum(pods[p["pod"].split("-r")[0]].cpu_milli for p in placed)
        assert sum(r.cpu_asked_milli for r in rows) == asked
    assert copies  # the copies of pods at 130 % are found under their trace name


def test_the_command_prints_a_line_per_kind_of_node(
    replayed: tuple[pathlib.Path, pathlib.Path], capsys: pytest.CaptureFixture[str]
) -> None:
    target, folder = replayed
    assert bymodel.main([str(target), "--trace-dir", str(folder)]) == 0
    out = capsys.readouterr().out
    kinds = {f"{n.model}/{n.gpus}" for n in trace.load_nodes(folder / trace.DEFAULT_NODE_FILE) if n.gpus}
    runs = sum(json.loads(line)["record"] == "run" for line in target.read_text().splitlines())
    assert runs and out.count(", seed ") == runs
    for kind in kinds:
        assert out.count(f"  {kind} ") == runs


def test_a_pod_missing_from_the_pod_file_is_a_clear_error(
    replayed: tuple[pathlib.Path, pathlib.Path], capsys: pytest.CaptureFixture[str]
) -> None:
    target, folder = replayed
    pod_file = folder / "tiny_pods.csv"
    pod_file.write_text("\n".join(pod_file.read_text().splitlines()[:2]) + "\n")  # the header and one pod
    assert bymodel.main([str(target), "--trace-dir", str(folder)]) == 2
    assert "is not in the pod file" in capsys.readouterr().err
    with pytest.raises(placements.PlacementsError, match="line 1: not a placements line"):
        bymodel.breakdown(["{}"], [], {})
