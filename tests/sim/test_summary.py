"""`python -m gpuslice.sim.summary`: real-scheduler replays of many seeds and workloads in one table."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from gpuslice.sim import summary


def _output(
    workload: str, *runs: tuple[int, float, float], refused: int = 0, lost: int = 0, **meta: Any
) -> dict[str, Any]:
    """A `gpuslice-sim --scheduler kube --json` output: runs are (seed, granted, model) as ratios."""
    return {
        "pods_file": f"openb_pod_list_{workload}.csv",
        "nodes": 10,
        "gpus": 40,
        "demand": 1.3,
        "arrival": "sequential",
        "mode": "device-plugin",
        **meta,
        "runs": [
            {
                "seed": seed,
                "arrival": meta.get("arrival", "sequential"),
                "kube": {
                    "gpu_allocation_ratio": granted,
                    "placed_pods": 100,
                    "failed_pods": 20,
                    "admission_failures": refused,
                },
                "model": {"gpu_allocation_ratio": model},
                "lost_pods": lost,
            }
            for seed, granted, model in runs
        ],
    }


def _write(directory: pathlib.Path, name: str, document: dict[str, Any]) -> str:
    path = directory / name
    path.write_text(json.dumps(document))
    return str(path)


def _paper(directory: pathlib.Path, figures: dict[str, float]) -> str:
    lines = ["workload,policy,n_seeds,alloc_pct_at_arrive100,alloc_pct_at_arrive130,unallocated_gpus_at_130"]
    for workload, figure in figures.items():
        lines += [
            f"openb_pod_list_{workload},05-BestFit,10,90.00,{figure - 2:.2f},400",
            f"openb_pod_list_{workload},06-FGD,10,94.00,{figure:.2f},300",
        ]
    (directory / "summary_alloc_at_130pct.csv").write_text("\n".join(lines) + "\n")
    return str(directory)


def _table_rows(text: str) -> dict[str, list[str]]:
    rows = [line.strip("|").split("|") for line in text.splitlines() if line.startswith("| ")][1:]
    return {cells[0].strip(): [cell.strip() for cell in cells] for cells in rows}


def test_seeds_of_one_workload_from_several_files_make_one_row_beside_the_paper(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = [
        _write(tmp_path, "a.json", _output("multigpu40", (42, 0.9683, 0.9688), refused=1)),
        _write(tmp_path, "b.json", _output("multigpu40", (43, 0.9701, 0.9690), (44, 0.9699, 0.9680), refused=2)),
        _write(tmp_path, "c.json", _output("default", (42, 0.9571, 0.9568))),
    ]
    assert summary.main([*files, "--paper-dir", _paper(tmp_path, {"multigpu40": 96.99, "default": 95.39})]) == 0
    rows = _table_rows(capsys.readouterr().out)
    assert list(rows) == ["default", "multigpu40"]  # the paper's order, not the files'
    multigpu = rows["multigpu40"]
    assert multigpu[2] == "42, 43, 44"
    assert multigpu[3] == "**96.94 %** (96.83-97.01)"  # mean of 96.83, 97.01, 96.99
    assert multigpu[4] == "96.86 %"
    assert multigpu[5] == "+0.08"
    # placed / unschedulable summed over seeds; refusals per file times its seeds
    assert multigpu[6] == "300 / 60 / 5 / 0"
    assert multigpu[7] == "96.99 %"
    assert multigpu[8] == "-0.05"
    assert multigpu[9] == "2 of 3"  # 97.01 and 96.99 (level counts) against the paper's 96.99
    assert rows["default"][3] == "**95.71 %**" and rows["default"][9] == "1 of 1"
    assert multigpu[10] == "?"  # outputs from before the commit was recorded: said, not guessed


def test_each_row_names_the_commits_its_seeds_ran_at(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = [
        _write(tmp_path, "a.json", _output("gpushare40", (42, 0.9433, 0.9428), commit="81879e3")),
        _write(tmp_path, "b.json", _output("gpushare40", (43, 0.9401, 0.9425), commit="0c70839")),
        _write(tmp_path, "c.json", _output("gpushare40", (44, 0.9410, 0.9420), commit="81879e3")),
    ]
    assert summary.main([*files, "--paper-dir", str(tmp_path / "absent")]) == 0
    assert _table_rows(capsys.readouterr().out)["gpushare40"][10] == "81879e3, 0c70839"


def test_the_same_seed_twice_is_refused_naming_both_files(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _write(tmp_path, "old.json", _output("gpushare40", (42, 0.9392, 0.9425)))
    second = _write(tmp_path, "new.json", _output("gpushare40", (42, 0.9401, 0.9425)))
    assert summary.main([first, second, "--paper-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "gpushare40 seed 42" in err and "old.json" in err and "new.json" in err


def test_paced_runs_and_other_arrivals_get_rows_of_their_own(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = [
        _write(tmp_path, "unpaced.json", _output("cpu250", (42, 0.9214, 0.9303), pacing=False)),
        _write(tmp_path, "paced.json", _output("cpu250", (42, 0.9265, 0.9319), pacing=True)),
        _write(tmp_path, "burst.json", _output("cpu250", (42, 0.9100, 0.9303), pacing=False, arrival="burst")),
        _write(tmp_path, "old.json", _output("cpu250", (42, 0.9200, 0.9303))),  # before "pacing" was written
    ]
    assert summary.main([*files, "--paper-dir", str(tmp_path / "absent")]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| cpu250")]
    conditions = [line.split("|")[2].strip() for line in lines]
    assert conditions == ["burst", "sequential", "sequential, paced", "sequential, pacing not recorded"]
    assert all("| ? |" in line for line in lines)  # no paper figures there: said, not invented


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("not json", "not readable as JSON"),
        (json.dumps({"pods_file": "x.csv", "runs": [{"seed": 1}]}), "missing or bad 'kube'"),
        (json.dumps({"nodes": 3}), "missing or bad 'pods_file'"),
        (json.dumps({"pods_file": "x.csv", "arrival": "sequential", "runs": []}), "holds no runs"),
    ],
)
def test_a_file_that_is_not_a_replay_output_is_named_with_what_is_wrong(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], content: str, says: str
) -> None:
    path = tmp_path / "run.json"
    path.write_text(content)
    assert summary.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"summary: {path}: ") and says in err
