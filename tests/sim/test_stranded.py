"""`python -m gpuslice.sim.stranded`: where a replay's unallocated GPU memory sits."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from gpuslice.sim import main as sim_main
from gpuslice.sim import placements, stranded

TINY = pathlib.Path(__file__).parents[1] / "data" / "trace"


def _pod(
    name: str,
    milli: int,
    outcome: str = "placed",
    node: str = "n1",
    gpus: list[dict[str, Any]] | None = None,
    num_gpu: int = 1,
) -> dict[str, Any]:
    return {
        "record": "pod",
        "configuration": "c",
        "seed": 1,
        "pod": name,
        "outcome": outcome,
        "node": node if outcome == "placed" else None,
        "num_gpu": num_gpu,
        "gpu_milli": milli,
        "requested_milli": num_gpu * milli,
        "gpus": gpus or [],
        "message": "",
    }


def _gpu(uuid: str, units: int, total: int) -> dict[str, Any]:
    return {"uuid": uuid, "units": units, "total_units": total, "unit_mib": 256, "gpu_memory_mib": total * 256}


def _lines(*pods: dict[str, Any], total_gpus: int = 4) -> list[str]:
    run = {
        "record": "run",
        "configuration": "c",
        "seed": 1,
        "pods_file": "p.csv",
        "pods": len(pods),
        "total_gpus": total_gpus,
        "gpu_allocation_ratio": 0.0,
        "requested_allocation_ratio": 0.0,
    }
    return [json.dumps(line) for line in (run, *pods)]


def test_free_share_is_grouped_by_what_each_gpu_holds_and_weighed_by_the_pods_that_fit() -> None:
    lines = _lines(
        _pod("big", 810, gpus=[_gpu("g1", 103, 128)]),  # 25 of 128 units left
        _pod("a", 470, gpus=[_gpu("g2", 28, 60)]),
        _pod("b", 470, gpus=[_gpu("g2", 28, 60)]),  # 4 of 60 left
        _pod("whole", 1000, gpus=[_gpu("g3", 128, 128)]),
        _pod("late", 160, outcome="unschedulable"),
    )
    [run] = stranded.stranded(lines)
    assert run.total_gpus == 4 and run.idle_gpus == 1 and run.partly_used == 2
    assert run.granted_gpus == pytest.approx(103 / 128 + 56 / 60 + 1)
    assert run.unallocated == pytest.approx(4 - run.granted_gpus)
    assert run.free_on_partly_used == pytest.approx(25 / 128 + 4 / 60)
    # Sharing pods that arrived: 810, 470, 470, 160. The 810 GPU's 25 units fit the 160 (20 units on
    # 128), 1 of 4 pods: more than 5 %; the 470 pair's 4 of 60 units fit none of them.
    assert run.unfillable == pytest.approx(4 / 60)
    assert run.rarely_fillable == pytest.approx(4 / 60)
    assert [(count, units, shares) for _, count, units, shares in run.by_contents] == [
        (1, 128, (810,)),
        (1, 60, (470, 470)),
    ]


def test_a_share_placed_is_taken_to_need_what_it_was_granted_there() -> None:
    # A 160 pod was granted 11 units of a 60-unit GPU (not floor(0.16 x 60) = 9): 10 free units
    # beside an 810 pod do not fit it.
    lines = _lines(
        _pod("big", 810, gpus=[_gpu("g1", 50, 60)]),
        _pod("small", 160, gpus=[_gpu("g2", 11, 60)]),
        _pod("c", 810, gpus=[_gpu("g2", 48, 60)]),
        total_gpus=2,
    )
    [run] = stranded.stranded(lines)
    assert run.unfillable == pytest.approx(10 / 60 + 1 / 60)


def test_its_totals_agree_with_the_recomputed_ratio_of_a_real_replay(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "placements.jsonl"
    args = ["--nodes", str(TINY / "tiny_nodes.csv"), "--pods", str(TINY / "tiny_pods.csv"), "--json"]
    assert sim_main.main([*args, "--seed", "3", "--placements", str(target)]) == 0
    capsys.readouterr()
    text = target.read_text().splitlines()
    figures = {f.configuration: f for f in placements.recompute(text)}
    for run in stranded.stranded(text):
        assert run.granted_gpus / run.total_gpus == pytest.approx(figures[run.configuration].gpu_allocation_ratio)
        assert run.free_on_partly_used <= run.unallocated + 1e-9
        assert sum(free for free, *_ in run.by_contents) == pytest.approx(run.free_on_partly_used)
    assert stranded.main([str(target), "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "gpuslice-default, seed 3" in out and "partly used GPUs" in out


def test_a_file_that_is_not_placements_is_refused_with_its_line(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(_lines()[0] + "\n" + json.dumps(_pod("x", 500) | {"configuration": "other"}) + "\n")
    assert stranded.main([str(bad)]) == 2
    assert "line 2" in capsys.readouterr().err
    bad.write_text('{"record": "run"}\n')
    assert stranded.main([str(bad)]) == 2
    assert "line 1: not a placements line" in capsys.readouterr().err
