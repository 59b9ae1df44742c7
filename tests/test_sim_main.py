"""The `gpuslice-sim` command line: JSON fields, errors, the paper's figures, the plot."""

from __future__ import annotations

import json
import pathlib

import pytest

from gpuslice.sim import main as sim_main

TINY = pathlib.Path(__file__).parent / "data" / "trace"
TINY_ARGS = ["--nodes", str(TINY / "tiny_nodes.csv"), "--pods", str(TINY / "tiny_pods.csv")]


def test_json_output_has_the_fields_of_every_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_main.main([*TINY_ARGS, "--json", "--seed", "3"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in document["configurations"]] == ["whole-gpu", "gpuslice-default", "gpuslice-binpack"]
    for entry in document["configurations"]:
        assert {"name", "gpu_allocation_ratio", "allocation_curve", "failed_pods", "admission_failures", "runtime_s"} <= set(entry)
        assert 0 <= entry["gpu_allocation_ratio"] <= 1
        assert len(entry["allocation_curve"]) == 131  # 0..130 % of arrived demand
        assert isinstance(entry["failed_pods"], int) and isinstance(entry["admission_failures"], int)
    assert document["nodes"] == 4 and document["gpus"] == 9


def test_configs_and_demand_choose_what_is_replayed(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_main.main([*TINY_ARGS, "--json", "--configs", "gpuslice-binpack", "--demand", "0.5"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in document["configurations"]] == ["gpuslice-binpack"]
    # Arrivals stop once half the GPU capacity has been asked for: the curve covers 0..50% and
    # a little beyond when the last (possibly multi-GPU) pod crosses 50%, far below 130%.
    assert 51 <= len(document["configurations"][0]["allocation_curve"]) < 80
    assert document["demand"] == 0.5


def test_the_text_report_names_every_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_main.main(TINY_ARGS) == 0
    out = capsys.readouterr().out
    for name in ("whole-gpu", "gpuslice-default", "gpuslice-binpack", "alloc@130%", "FGD paper figures not found"):
        assert name in out


def test_a_missing_trace_directory_is_a_clear_error(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_main.main(["--trace-dir", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "no Alibaba GPU trace at" in err and "GPUSLICE_TRACE_DIR" in err


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--configs", "fastest"], "--configs: unknown fastest"),
        (["--demand", "0"], "--demand must be greater than 0"),
        (["--percentage-of-nodes-to-score", "101"], "must be 0..100"),
    ],
    ids=["unknown-config", "zero-demand", "bad-percentage"],
)
def test_bad_flags_are_refused_naming_the_flag(flags: list[str], problem: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        sim_main.main([*TINY_ARGS, *flags])
    assert caught.value.code == 2
    assert problem in capsys.readouterr().err


def test_the_plot_draws_a_png(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib", reason="--plot needs the plot extra (matplotlib)")
    target = tmp_path / "alloc.png"
    assert sim_main.main([*TINY_ARGS, "--plot", str(target)]) == 0
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.tracedata
def test_the_papers_figures_for_the_default_trace_are_read(trace_dir: pathlib.Path) -> None:
    figures = sim_main.paper_figures(trace_dir.parent / "fgd-paper-results", "openb_pod_list_default", with_curves=True)
    assert figures is not None
    assert figures.summary["06-FGD"]["alloc_pct_at_arrive130"] == pytest.approx(95.39)
    assert figures.summary["01-Random"]["unallocated_gpus_at_130"] == 778
    assert len(figures.curves["06-FGD"]) == 131
    assert 0.9 < figures.curves["06-FGD"][-1] < 1.0
