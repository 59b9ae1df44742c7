"""The `gpuslice-sim` command line: JSON fields, errors (--plot refused with --scheduler kube among
them), the paper's figures, the plot."""

from __future__ import annotations

import io
import json
import multiprocessing
import pathlib
import statistics
import subprocess
import sys
import types
from typing import Any

import pytest

from gpuslice.sim import main as sim_main
from gpuslice.sim import progress, provenance, replay

TINY = pathlib.Path(__file__).parents[1] / "data" / "trace"
TINY_ARGS = ["--nodes", str(TINY / "tiny_nodes.csv"), "--pods", str(TINY / "tiny_pods.csv")]


def test_json_output_has_the_fields_of_every_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_main.main([*TINY_ARGS, "--json", "--seed", "3"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in document["configurations"]] == ["whole-gpu", "gpuslice-default", "gpuslice-binpack"]
    for entry in document["configurations"]:
        assert {
            "name",
            "gpu_allocation_ratio",
            "allocation_curve",
            "failed_pods",
            "admission_failures",
            "runtime_s",
        } <= set(entry)
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


def test_the_reports_label_the_granted_headline_and_the_requested_second_figure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    document = _json_run(capsys, "--configs", "gpuslice-default")
    entry = document["configurations"][0]
    # Fractions are granted floor(f x units): the pods hold less than they asked for.
    assert entry["gpu_allocation_ratio"] < entry["requested_allocation_ratio"]
    assert sim_main.main([*TINY_ARGS, "--configs", "gpuslice-default"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("gpuslice-default"))
    assert row.split()[2] == f"{entry['gpu_allocation_ratio']:.2%}"
    assert row.split()[-1] == f"{entry['requested_allocation_ratio']:.2%}"
    assert "alloc = GPU memory kubelet granted" in out and "requested = sum of gpu_milli" in out


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
        (["--seeds", "0"], "--seeds must be at least 1, got 0"),
        (["--jobs", "0"], "--jobs must be at least 1, got 0"),
        (["--fgd-popularity-threshold", "0"], "--fgd-popularity-threshold must be in (0, 100], got 0"),
        (["--fgd-popularity-threshold", "100.5"], "--fgd-popularity-threshold must be in (0, 100], got 100.5"),
    ],
    ids=[
        "unknown-config",
        "zero-demand",
        "bad-percentage",
        "zero-seeds",
        "zero-jobs",
        "popularity-0",
        "popularity-over",
    ],
)
def test_bad_flags_are_refused_naming_the_flag(
    flags: list[str], problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        sim_main.main([*TINY_ARGS, *flags])
    assert caught.value.code == 2
    assert problem in capsys.readouterr().err


def test_the_plot_draws_a_png(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib", reason="--plot needs the plot extra (matplotlib)")
    target = tmp_path / "alloc.png"
    assert sim_main.main([*TINY_ARGS, "--plot", str(target)]) == 0
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_plot_of_several_seeds_draws_their_mean_curve(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib", reason="--plot needs the plot extra (matplotlib)")
    target = tmp_path / "alloc.png"
    assert sim_main.main([*TINY_ARGS, "--seeds", "2", "--plot", str(target)]) == 0
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot written to {target}" in capsys.readouterr().out


def test_the_json_output_names_the_commit_it_ran_from(capsys: pytest.CaptureFixture[str]) -> None:
    document = _json_run(capsys, "--configs", "gpuslice-default")
    assert document["commit"] == provenance.source_commit()


def _json_run(capsys: pytest.CaptureFixture[str], *flags: str) -> dict[str, Any]:
    assert sim_main.main([*TINY_ARGS, "--json", *flags]) == 0
    document: dict[str, Any] = json.loads(capsys.readouterr().out)
    return document


def _without_timings(value: Any) -> Any:
    """The document minus wall-clock and CPU times, which differ from run to run."""
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if k not in ("runtime_s", "cpu_s")}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value


def test_each_seed_of_a_multi_seed_run_equals_a_single_run_with_that_seed(capsys: pytest.CaptureFixture[str]) -> None:
    several = _json_run(capsys, "--seed", "5", "--seeds", "3")
    singles = [_json_run(capsys, "--seed", str(seed)) for seed in (5, 6, 7)]
    assert several["seeds"] == [5, 6, 7]
    assert several["arrivals"] == [single["arrivals"] for single in singles]
    for index, entry in enumerate(several["configurations"]):
        assert [s["seed"] for s in entry["seeds"]] == [5, 6, 7]
        for per_seed, single in zip(entry["seeds"], singles, strict=True):
            alone = single["configurations"][index]
            assert per_seed["gpu_allocation_ratio"] == alone["gpu_allocation_ratio"]
            assert per_seed["at_demand_100"] == alone["allocation_curve"][100]
            # Everything else too: the per-seed entry is the single run's, less its curve.
            assert per_seed["requested_at_demand_100"] == alone["requested_allocation_curve"][100]
            own = {k: v for k, v in per_seed.items() if k not in ("seed", "at_demand_100", "requested_at_demand_100")}
            curveless = {k: v for k, v in alone.items() if k not in ("allocation_curve", "requested_allocation_curve")}
            assert _without_timings(own) == _without_timings(curveless)


def test_a_multi_seed_run_reports_the_mean_spread_and_totals(capsys: pytest.CaptureFixture[str]) -> None:
    document = _json_run(capsys, "--seeds", "3")
    assert document["seed"] == 42 and document["seeds"] == [42, 43, 44]
    for entry in document["configurations"]:
        per_seed = entry["seeds"]
        ratios = [s["gpu_allocation_ratio"] for s in per_seed]
        assert entry["gpu_allocation_ratio"] == pytest.approx(statistics.fmean(ratios), abs=1e-6)
        assert entry["gpu_allocation_ratio_min"] == min(ratios) and entry["gpu_allocation_ratio_max"] == max(ratios)
        assert entry["gpu_allocation_ratio_stdev"] == pytest.approx(statistics.stdev(ratios), abs=1e-6)
        assert entry["at_demand_100"] == pytest.approx(statistics.fmean(s["at_demand_100"] for s in per_seed), abs=1e-6)
        assert entry["failed_pods"] == pytest.approx(statistics.fmean(s["failed_pods"] for s in per_seed), abs=1e-3)
        unallocated = statistics.fmean(s["unallocated_gpus"] for s in per_seed)
        assert entry["unallocated_gpus"] == pytest.approx(unallocated, abs=1e-3)
        assert entry["admission_failures"] == sum(s["admission_failures"] for s in per_seed)
        assert isinstance(entry["admission_failures"], int)
        assert entry["cpu_s"] == pytest.approx(sum(s["cpu_s"] for s in per_seed), abs=1e-2)
        # The mean curve is kept once per configuration, the per-seed curves are dropped.
        assert len(entry["allocation_curve"]) >= 131
        assert entry["allocation_curve"][100] == pytest.approx(entry["at_demand_100"], abs=1e-6)
        assert all("allocation_curve" not in s for s in per_seed)
        requested = [s["requested_allocation_ratio"] for s in per_seed]
        assert entry["requested_allocation_ratio"] == pytest.approx(statistics.fmean(requested), abs=1e-6)
        assert entry["requested_allocation_ratio_max"] == max(requested)
        assert entry["requested_at_demand_100"] == pytest.approx(
            statistics.fmean(s["requested_at_demand_100"] for s in per_seed), abs=1e-6
        )


def test_the_number_of_jobs_does_not_change_the_results(capsys: pytest.CaptureFixture[str]) -> None:
    in_process = _json_run(capsys, "--seeds", "2", "--jobs", "1")
    in_workers = _json_run(capsys, "--seeds", "2", "--jobs", "2")
    assert _without_timings(in_process) == _without_timings(in_workers)


def _grpc_threads_winding_down() -> None:
    """What a test run leaves in the process before a replay starts its workers: gRPC servers and
    channels, their threads still running, dropped."""
    from concurrent import futures

    import grpc

    for _ in range(3):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(channel).result(timeout=10)
        channel.subscribe(lambda state: None, try_to_connect=True)
        del server, channel


def test_worker_processes_do_not_inherit_the_grpc_state_of_the_process_that_starts_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Forked workers crashed (BrokenProcessPool) or spun in their garbage collector on such state.
    for _ in range(3):
        _grpc_threads_winding_down()
        assert sim_main.main([*TINY_ARGS, "--json", "--seeds", "2", "--jobs", "2"]) == 0
        assert len(json.loads(capsys.readouterr().out)["configurations"]) == 3


# Run in a fresh interpreter: the workers must see the patched replay, so they are forked, and a
# fork of this test process would copy the gRPC threads earlier tests left (the very thing
# _worker_context avoids), which crashed the pool now and then.
_REFUSED_IN_A_WORKER = """
import multiprocessing, sys
from gpuslice.sim import main as sim_main, replay, trace

def refuse_the_trace(*args, **kwargs):
    raise trace.TraceError("tiny_nodes.csv: refused in a worker process")

replay.replay = refuse_the_trace
sim_main._worker_context = lambda: multiprocessing.get_context("fork")
sys.exit(sim_main.main(sys.argv[1:]))
"""


@pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="workers see the patched replay only when forked"
)
def test_an_error_in_a_worker_process_is_reported_as_usual() -> None:
    finished = subprocess.run(
        [sys.executable, "-c", _REFUSED_IN_A_WORKER, *TINY_ARGS, "--seeds", "2", "--jobs", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (finished.returncode, finished.stderr) == (2, "gpuslice-sim: tiny_nodes.csv: refused in a worker process\n")


def test_the_text_report_of_several_seeds_names_the_mean_and_range(capsys: pytest.CaptureFixture[str]) -> None:
    binpack = _json_run(capsys, "--seeds", "2")["configurations"][2]
    assert sim_main.main([*TINY_ARGS, "--seeds", "2"]) == 0
    out = capsys.readouterr().out
    assert "mean of 2 seeds (42–43)" in out and "min–max@130%" in out
    spread = f"{binpack['gpu_allocation_ratio_min']:.2%}–{binpack['gpu_allocation_ratio_max']:.2%}"
    assert any(line.startswith("gpuslice-binpack") and spread in line for line in out.splitlines())


@pytest.mark.tracedata
def test_the_papers_figures_for_the_default_trace_are_read(trace_dir: pathlib.Path) -> None:
    figures = sim_main.paper_figures(trace_dir.parent / "fgd-paper-results", "openb_pod_list_default", with_curves=True)
    assert figures is not None
    assert figures.summary["06-FGD"]["alloc_pct_at_arrive130"] == pytest.approx(95.39)
    assert figures.summary["01-Random"]["unallocated_gpus_at_130"] == 778
    assert len(figures.curves["06-FGD"]) == 131
    assert 0.9 < figures.curves["06-FGD"][-1] < 1.0


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal, so the progress bar draws on it."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("jobs", ["1", "2"], ids=["in-process", "workers"])
def test_a_terminal_shows_a_progress_bar_over_every_pod_and_the_json_stays_clean(
    jobs: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    bars = _recorded_bars(monkeypatch)
    assert sim_main.main([*TINY_ARGS, "--json", "--seeds", "2", "--jobs", jobs]) == 0
    document = json.loads(capsys.readouterr().out)  # stdout is only the document
    [(shown, disabled)] = bars
    assert not disabled
    assert shown.n == shown.total == len(document["configurations"]) * sum(document["arrivals"])
    assert "replaying" in terminal.getvalue()


def _recorded_bars(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, bool]]:
    """Every bar made, with whether it was off when made (closing one turns it off)."""
    made: list[tuple[Any, bool]] = []
    real = progress.bar

    def recording(*args: Any, **kwargs: Any) -> Any:
        shown = real(*args, **kwargs)
        made.append((shown, shown.disable))
        return shown

    monkeypatch.setattr(progress, "bar", recording)
    return made


def test_without_a_terminal_there_is_no_progress_output(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bars = _recorded_bars(monkeypatch)
    assert sim_main.main([*TINY_ARGS, "--json", "--seeds", "2", "--jobs", "1"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    json.loads(out)
    assert [disabled for _, disabled in bars] == [True]


def test_plot_without_matplotlib_fails_before_replaying_with_the_install_hint(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError

    def no_replay(*args: object, **kwargs: object) -> None:
        raise AssertionError("replayed before the --plot check")

    monkeypatch.setattr(replay, "replay", no_replay)
    assert sim_main.main([*TINY_ARGS, "--jobs", "1", "--plot", str(tmp_path / "alloc.png")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert "--plot needs matplotlib" in err and "pip install -e '.[plot]'" in err


@pytest.mark.parametrize(
    ("where", "problem"),
    [("missing/alloc.png", "no directory"), (".", "is a directory")],
    ids=["no-folder", "a-folder"],
)
def test_plot_to_an_unwritable_path_fails_before_replaying(
    where: str,
    problem: str,
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", types.ModuleType("matplotlib"))  # installed or not

    def no_replay(*args: object, **kwargs: object) -> None:
        raise AssertionError("replayed before the --plot check")

    monkeypatch.setattr(replay, "replay", no_replay)
    assert sim_main.main([*TINY_ARGS, "--jobs", "1", "--plot", str(tmp_path / where)]) == 2
    assert problem in capsys.readouterr().err


@pytest.mark.parametrize(("package", "missing"), [("gpuslice.sim", "tqdm"), ("gpuslice.demo", "jsonpatch")])
def test_an_install_without_the_sim_extra_is_told_how_to_get_it(package: str, missing: str) -> None:
    code = f"import sys; sys.modules[{missing!r}] = None; import {package}"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 1
    assert f"needs the simulator's extra, which this install lacks ({missing})" in result.stderr
    assert "pip install 'gpuslice[sim]'" in result.stderr


def test_a_plot_is_refused_with_the_kube_replay(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_main.main(["--scheduler", "kube", "--plot", str(tmp_path / "out.png")]) == 2
    assert "--plot: only with --scheduler model" in capsys.readouterr().err
    assert not (tmp_path / "out.png").exists()
