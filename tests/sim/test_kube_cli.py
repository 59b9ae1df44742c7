"""`gpuslice-sim --scheduler kube`'s command line (sim/kube_cli.py): node sampling, the resource modes,
and the errors said before any replay. The replays themselves run in tests/e2e/test_real_replay.py."""

from __future__ import annotations

import argparse
import pathlib

import pytest

from gpuslice.sim import controlplane, kube_cli, kube_replay, main, trace


def test_node_sample_keeps_the_ends_and_the_order() -> None:
    nodes = [trace.TraceNode(f"n{i}", 1000, 1024, 1, "T4") for i in range(10)]
    assert [n.name for n in kube_cli.sample_nodes(nodes, 3)] == ["n0", "n4", "n9"]
    assert kube_cli.sample_nodes(nodes, None) == nodes
    assert kube_cli.sample_nodes(nodes, 50) == nodes
    with pytest.raises(ValueError, match="node-sample"):
        kube_cli.sample_nodes(nodes, 0)


def test_without_the_components_the_command_says_what_is_missing(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("GPUSLICE_K8S_BIN", raising=False)
    code = main.main(["--scheduler", "kube", "--kube-bin", str(tmp_path), "--trace-dir", str(tmp_path)])
    assert code == 2
    assert "--scheduler kube needs the built Kubernetes components" in capsys.readouterr().err


def test_a_bad_arrival_mode_on_the_command_line_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main.main(["--scheduler", "kube", "--arrival", "later"]) == 2
    assert "--arrival must be sequential, burst or compressed:<factor>" in capsys.readouterr().err


def test_a_placements_file_that_cannot_be_written_is_said_before_the_replay(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,T4\n")
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1000,1024,1,500\n")
    for binary in controlplane.BINARIES:  # present, never run: the check comes first
        (tmp_path / binary).write_text("")
        (tmp_path / binary).chmod(0o755)
    argv = ["--scheduler", "kube", "--kube-bin", str(tmp_path), "--nodes", str(nodes), "--pods", str(pods)]
    target = tmp_path / "missing" / "out.jsonl"
    assert main.main([*argv, "--placements", str(target)]) == 2
    assert f"gpuslice-sim: --placements {target}: No such file or directory" in capsys.readouterr().err


def test_modes_are_device_plugin_dra_or_both_each_once() -> None:
    assert kube_cli.parse_modes("dra") == ("dra",)
    assert kube_cli.parse_modes("device-plugin, dra") == ("device-plugin", "dra")
    for bad in ("", "dra,dra", "dra,x", "both"):
        with pytest.raises(argparse.ArgumentTypeError, match="give device-plugin, dra, or device-plugin,dra"):
            kube_cli.parse_modes(bad)


@pytest.mark.parametrize("text", ["-1", "nan", "3601", "soon"])
def test_a_kubelet_prepare_delay_that_is_no_number_of_seconds_is_an_error(
    text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main.main(["--scheduler", "kube", "--kubelet-prepare-seconds", text])
    assert f"{text!r} is not a number of seconds from 0 to 3600" in capsys.readouterr().err


def test_a_kubelet_prepare_delay_is_read_in_seconds() -> None:
    parser = argparse.ArgumentParser()
    kube_cli.add_arguments(parser)
    assert parser.parse_args(["--kubelet-prepare-seconds", "1.5"]).kubelet_prepare_seconds == 1.5
    assert parser.parse_args([]).kubelet_prepare_seconds == 0.0


def test_a_kubelet_prepare_delay_without_dra_mode_is_refused_before_any_replay(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    kube_bin = tmp_path / "bin"
    kube_bin.mkdir()
    for name in controlplane.BINARIES:
        (kube_bin / name).write_text("#!/bin/sh\n")
        (kube_bin / name).chmod(0o755)
    code = main.main(["--scheduler", "kube", "--kube-bin", str(kube_bin), "--kubelet-prepare-seconds", "1"])
    assert code == 2
    assert "--kubelet-prepare-seconds is for DRA mode" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["0", "-5", "nan", "86401", "long"])
def test_a_settle_limit_that_is_no_positive_number_of_seconds_is_an_error(
    text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main.main(["--scheduler", "kube", "--settle-limit", text])
    assert f"{text!r} is not a number of seconds above 0 and at most 86400" in capsys.readouterr().err


class _Replayed(Exception):
    """Raised by the stand-in replay: the test needs only what it was given."""


def test_the_settle_limit_reaches_the_replay(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A full-size burst of fractions in DRA mode outlasts the default wait for the pods' outcomes.
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,T4\n")
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1000,1024,1,500\n")
    for binary in controlplane.BINARIES:  # present, never run: the replay is stood in for
        (tmp_path / binary).write_text("")
        (tmp_path / binary).chmod(0o755)
    given: list[float] = []

    def replay_on_kube(*args: object, settle_limit: float, **kwargs: object) -> None:
        given.append(settle_limit)
        raise _Replayed

    monkeypatch.setattr(kube_cli.kube_replay, "replay_on_kube", replay_on_kube)
    argv = ["--scheduler", "kube", "--kube-bin", str(tmp_path), "--nodes", str(nodes), "--pods", str(pods)]
    for extra, limit in (([], kube_replay.SETTLE_LIMIT_SECONDS), (["--settle-limit", "5400"], 5400.0)):
        with pytest.raises(_Replayed):
            main.main([*argv, "--configs", "gpuslice-default", *extra])
        assert given.pop() == limit


def test_a_scheduler_restart_is_reported_with_its_status_and_how_long_it_took() -> None:
    restart = {"at_s": 12.34, "status": -9, "ready_after_s": 2.5}
    assert kube_cli._restart_line(restart) == "kube-scheduler exited (status -9) 12.3 s in; running again 2.5 s later"
    never = kube_cli._restart_line({**restart, "status": 1, "ready_after_s": None})
    assert never == "kube-scheduler exited (status 1) 12.3 s in; not running again by the end"
