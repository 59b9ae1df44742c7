"""`gpuslice-sim --placements`: one JSON line per pod, and the figures recomputed from the file alone."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from gpuslice import config
from gpuslice.sim import main as sim_main
from gpuslice.sim import placements, replay, trace

TINY = pathlib.Path(__file__).parents[1] / "data" / "trace"
TINY_ARGS = ["--nodes", str(TINY / "tiny_nodes.csv"), "--pods", str(TINY / "tiny_pods.csv")]


Rows = list[dict[str, Any]]


def _run(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], *flags: str
) -> tuple[dict[str, Any], Rows, pathlib.Path]:
    target = tmp_path / "placements.jsonl"
    assert sim_main.main([*TINY_ARGS, "--json", "--placements", str(target), *flags]) == 0
    document = json.loads(capsys.readouterr().out)
    return document, [json.loads(line) for line in target.read_text().splitlines()], target


def test_every_arrival_gets_one_line_with_its_outcome_node_and_grant(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document, rows, _ = _run(tmp_path, capsys, "--seed", "3")
    runs = [r["configuration"] for r in rows if r["record"] == "run"]
    assert runs == ["whole-gpu", "gpuslice-default", "gpuslice-binpack"]
    for entry in document["configurations"]:
        pods = [r for r in rows if r["record"] == "pod" and r["configuration"] == entry["name"]]
        assert len(pods) == document["arrivals"]
        assert sum(r["outcome"] == "placed" for r in pods) == entry["placed_pods"]
        assert sum(r["outcome"] == "unschedulable" for r in pods) == entry["failed_pods"]
        for row in pods:
            assert {"pod", "node", "gpus", "requested_milli", "message", "seed"} <= set(row)
            if row["outcome"] == "placed" and row["num_gpu"]:
                assert len(row["gpus"]) == row["num_gpu"]
                for gpu in row["gpus"]:
                    assert 0 < gpu["units"] <= gpu["total_units"]
                    assert gpu["units"] * gpu["unit_mib"] <= gpu["gpu_memory_mib"]
            if row["outcome"] == "unschedulable":
                assert row["node"] is None and row["gpus"] == [] and "nodes are available" in row["message"]


def test_a_pod_refused_by_kubelet_is_recorded_with_its_node_and_message() -> None:
    # Without steering the third 0.6-of-a-T4 pod passes the scheduler on the node's total free
    # units and the plugin's Allocate refuses units that span GPUs.
    settings = config.load(environ={}, overrides={"steering.enabled": False})
    node = trace.TraceNode(name="t4-node", cpu_milli=64000, memory_mib=262144, gpus=2, model="T4")
    pods = [trace.TracePod(name=n, cpu_milli=1000, memory_mib=1024, num_gpu=1, gpu_milli=600) for n in "abc"]
    result = replay.replay([node], pods, replay.configurations(settings)["gpuslice-default"], seed=0, placements=True)
    assert result.placements is not None
    assert [r["outcome"] for r in result.placements] == ["placed", "placed", "refused"]
    refused = result.placements[2]
    assert refused["node"] == "t4-node" and refused["gpus"] == [] and refused["granted_gpus"] == 0
    assert refused["message"].startswith("kubelet: ") and "span" in refused["message"]
    placed = result.placements[0]
    assert placed["gpus"][0]["units"] == 36 and placed["gpus"][0]["total_units"] == 60
    assert placed["requested_milli"] == 600 and placed["granted_gpus"] == pytest.approx(0.6)


def test_the_figures_recomputed_from_the_file_equal_the_reported_ones(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document, _, target = _run(tmp_path, capsys, "--seeds", "2")
    figures = placements.recompute(target.read_text().splitlines())
    assert len(figures) == 6  # three configurations x two seeds
    for entry in document["configurations"]:
        for per_seed in entry["seeds"]:
            mine = next(f for f in figures if (f.configuration, f.seed) == (entry["name"], per_seed["seed"]))
            assert mine.gpu_allocation_ratio == pytest.approx(per_seed["gpu_allocation_ratio"], abs=1e-6)
            assert mine.requested_allocation_ratio == pytest.approx(per_seed["requested_allocation_ratio"], abs=1e-6)
            assert mine.placed == per_seed["placed_pods"]
    assert placements.main([str(target)]) == 0
    out = capsys.readouterr().out
    assert out.count("same") == 6 and "DIFFERS" not in out


def test_a_changed_grant_is_caught(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, rows, target = _run(tmp_path, capsys, "--configs", "gpuslice-default")
    placed = next(r for r in rows if r.get("outcome") == "placed" and r["gpus"] and r["gpus"][0]["units"] > 1)
    placed["gpus"][0]["units"] -= 1
    target.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert placements.main([str(target)]) == 1
    assert "DIFFERS" in capsys.readouterr().out


def test_a_file_that_is_not_a_placements_file_is_a_clear_error(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"hello": 1}\n')
    assert placements.main([str(bad)]) == 2
    assert "line 1: not a placements line" in capsys.readouterr().err
