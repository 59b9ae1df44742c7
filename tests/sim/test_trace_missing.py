"""`gpuslice-sim` without the Alibaba trace or the FGD paper's results: one clear error (or, for the
paper, one note) that names what is missing, where it was looked for and how to get it; never a
traceback. The paper's figures are computed from its curves file when the summary file is absent."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from gpuslice.sim import main as sim_main
from gpuslice.sim import trace

TINY = pathlib.Path(__file__).parents[1] / "data" / "trace"
SOURCE = "https://github.com/alibaba/clusterdata, folder cluster-trace-gpu-v2023/csv"


def _how_to_get_it(err: str) -> None:
    assert SOURCE in err and "research use only" in err
    assert "openb_node_list_gpu_node.csv" in err and "openb_pod_list_*.csv" in err
    assert "--trace-dir DIR" in err and "GPUSLICE_TRACE_DIR" in err
    assert '"Reproducing the headline"' in err
    assert "Traceback" not in err


def test_a_trace_folder_that_does_not_exist_is_named_with_how_to_get_the_trace(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "alibaba-gpu-2023"
    assert sim_main.main(["--trace-dir", str(missing)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    first = captured.err.splitlines()[0]
    assert first == f"gpuslice-sim: no Alibaba GPU trace at {missing} (from --trace-dir): no such folder."
    _how_to_get_it(captured.err)


def test_a_trace_folder_without_the_node_list_names_the_file(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUSLICE_TRACE_DIR", str(tmp_path))
    assert sim_main.main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"gpuslice-sim: no Alibaba GPU trace at {tmp_path} (from GPUSLICE_TRACE_DIR): "
        "openb_node_list_gpu_node.csv is not in it.\n"
    )
    _how_to_get_it(err)


def test_the_default_place_is_named_when_nothing_says_where_the_trace_is(tmp_path: pathlib.Path) -> None:
    with pytest.raises(trace.TraceError) as caught:
        trace.find_trace_dir(None, {}, tmp_path / "checkout")
    message = str(caught.value)
    default = tmp_path / "shared" / "data" / "alibaba-gpu-2023"
    assert message.startswith(
        f"no Alibaba GPU trace at {default} (the default: neither --trace-dir nor GPUSLICE_TRACE_DIR is set)"
    )
    _how_to_get_it(message)


def test_a_pod_list_that_is_not_there_is_named(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    pods = tmp_path / "openb_pod_list_gpushare100.csv"
    assert sim_main.main(["--nodes", str(TINY / "tiny_nodes.csv"), "--pods", str(pods)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpuslice-sim: trace file {pods} is not there.\n")
    _how_to_get_it(err)


def test_the_default_pod_list_missing_from_a_trace_folder_is_named(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / trace.DEFAULT_NODE_FILE).write_text((TINY / "tiny_nodes.csv").read_text())
    assert sim_main.main(["--trace-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpuslice-sim: trace file {tmp_path / trace.DEFAULT_POD_FILE} is not there.\n")
    _how_to_get_it(err)


def test_the_command_exits_2_with_the_message_and_no_traceback(tmp_path: pathlib.Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpuslice.sim.main", "--trace-dir", str(tmp_path / "nowhere")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"gpuslice-sim: no Alibaba GPU trace at {tmp_path / 'nowhere'}")
    _how_to_get_it(done.stderr)


def test_without_the_papers_results_the_report_says_which_files_where(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = str(TINY / "tiny_nodes.csv"), str(TINY / "tiny_pods.csv")
    paper_dir = tmp_path / "fgd-paper-results"
    args = ["--nodes", nodes, "--pods", pods, "--configs", "gpuslice-default", "--paper-dir", str(paper_dir)]
    assert sim_main.main(args) == 0
    out = capsys.readouterr().out
    assert (
        "(FGD paper figures not found: neither summary_alloc_at_130pct.csv nor analysis_allo_discrete.csv "
        f"is in {paper_dir}."
    ) in out
    assert "hkust-adsl/kubernetes-scheduler-simulator" in out and "--paper-dir DIR" in out


_CURVES_HEADER = "workload,sc_policy,tune,seed,total_gpus," + ",".join(str(p) for p in range(131))


def _curve(workload: str, policy: str, seed: int, at_100: float, at_130: float) -> str:
    values = [0.0] * 131
    values[100], values[130] = at_100, at_130
    return f"{workload},{policy},1.3,{seed},1000," + ",".join(f"{v:g}" for v in values)


def test_without_the_summary_file_the_papers_figures_are_the_means_of_its_curves(tmp_path: pathlib.Path) -> None:
    lines = [
        _CURVES_HEADER,
        _curve("openb_pod_list_default", "06-FGD", 42, 95.0, 95.2),
        _curve("openb_pod_list_default", "06-FGD", 43, 95.4, 95.6),
        _curve("openb_pod_list_default", "01-Random", 42, 86.0, 87.0),
        _curve("openb_pod_list_gpushare100", "06-FGD", 42, 80.0, 81.0),
    ]
    (tmp_path / sim_main.PAPER_CURVES_FILE).write_text("\n".join(lines) + "\n")
    figures = sim_main.paper_figures(tmp_path, "openb_pod_list_default", with_curves=False)
    assert figures is not None
    assert figures.summary["06-FGD"] == {
        "alloc_pct_at_arrive100": 95.2,
        "alloc_pct_at_arrive130": 95.4,
        "unallocated_gpus_at_130": 46.0,  # 1000 GPUs x (1 - 95.4 %)
    }
    assert figures.summary["01-Random"]["alloc_pct_at_arrive130"] == 87.0
    assert set(figures.summary) == {"06-FGD", "01-Random"}
    assert sim_main.paper_figures(tmp_path / "nowhere", "openb_pod_list_default", with_curves=False) is None


@pytest.mark.tracedata
def test_the_papers_curves_alone_give_its_published_summary_to_the_hundredth(
    trace_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    published = trace_dir.parent / "fgd-paper-results"
    (tmp_path / sim_main.PAPER_CURVES_FILE).symlink_to(published / sim_main.PAPER_CURVES_FILE)
    summary = sim_main.paper_figures(published, "openb_pod_list_default", with_curves=False)
    computed = sim_main.paper_figures(tmp_path, "openb_pod_list_default", with_curves=False)
    assert summary is not None and computed is not None
    assert computed.summary["06-FGD"] == summary.summary["06-FGD"]  # 95.23 / 95.39 / 286
    for policy, row in summary.summary.items():
        for key, value in row.items():
            assert computed.summary[policy][key] == pytest.approx(value, abs=0.011)
