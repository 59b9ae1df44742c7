"""The parts of `gpuslice-sim --scheduler kube` that need no control plane: arrival modes, node
sampling, the scheduler configuration and the webhook's config.yaml made from the model's settings,
the trace's inter-arrival gaps, and the command line's errors. The replay itself runs in
tests/e2e/test_real_replay.py."""

from __future__ import annotations

import argparse
import dataclasses
import pathlib

import pytest

from gpuslice import config
from gpuslice.sim import kube_replay, main, replay, trace


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("sequential", kube_replay.Arrival("sequential")),
        ("burst", kube_replay.Arrival("burst")),
        ("compressed:3600", kube_replay.Arrival("compressed", 3600.0)),
    ],
)
def test_arrival_modes(text: str, expected: kube_replay.Arrival) -> None:
    assert kube_replay.parse_arrival(text) == expected
    assert str(kube_replay.parse_arrival(text)) == text


@pytest.mark.parametrize("text", ["", "bursty", "compressed", "compressed:0", "compressed:-2", "compressed:x"])
def test_a_bad_arrival_mode_is_named(text: str) -> None:
    with pytest.raises(ValueError, match="arrival"):
        kube_replay.parse_arrival(text)


def test_node_sample_keeps_the_ends_and_the_order() -> None:
    nodes = [trace.TraceNode(f"n{i}", 1000, 1024, 1, "T4") for i in range(10)]
    assert [n.name for n in kube_replay.sample_nodes(nodes, 3)] == ["n0", "n4", "n9"]
    assert kube_replay.sample_nodes(nodes, None) == nodes
    assert kube_replay.sample_nodes(nodes, 50) == nodes
    with pytest.raises(ValueError, match="node-sample"):
        kube_replay.sample_nodes(nodes, 0)


def test_the_default_profile_is_kube_schedulers_own() -> None:
    profile = replay.configurations(config.Config())["gpuslice-default"].profile
    document = kube_replay.scheduler_configuration(profile)
    assert document["profiles"] == [{"schedulerName": "default-scheduler"}]


def test_the_binpack_profile_scores_every_pod_as_the_model_does() -> None:
    profile = replay.configurations(config.Config())["gpuslice-binpack"].profile
    profiles = kube_replay.scheduler_configuration(profile)["profiles"]
    assert [p["schedulerName"] for p in profiles] == ["gpuslice-binpack", "default-scheduler"]
    strategy = profiles[1]["pluginConfig"][0]["args"]["scoringStrategy"]
    assert strategy["type"] == "MostAllocated"
    assert {"name": "gpuslice.io/gpu-memory", "weight": 10} in strategy["resources"]


def test_the_webhooks_config_file_reads_back_as_the_same_settings(tmp_path: pathlib.Path) -> None:
    import yaml

    settings = dataclasses.replace(
        config.Config(), convert_whole_gpus=True, steering=dataclasses.replace(config.Config().steering, cpu_pods=False)
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(kube_replay.settings_document(settings)))
    assert config.load(path, environ={}) == settings


def test_trace_gaps_are_the_sorted_creation_times_differences(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time\na,1,1,0,0,30\nb,1,1,0,0,0\nc,1,1,0,0,10\n"
    )
    assert kube_replay.trace_gaps(path) == [10.0, 20.0]
    path.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,0,0\n")
    with pytest.raises(trace.TraceError, match="creation_time"):
        kube_replay.trace_gaps(path)


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


@pytest.mark.parametrize("flag", ["--plot", "--placements"])
def test_model_only_outputs_are_refused_with_the_kube_replay(
    flag: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main.main(["--scheduler", "kube", flag, str(tmp_path / "out")]) == 2
    assert f"{flag}: only with --scheduler model" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_modes_are_device_plugin_dra_or_both_each_once() -> None:
    assert kube_replay.parse_modes("dra") == ("dra",)
    assert kube_replay.parse_modes("device-plugin, dra") == ("device-plugin", "dra")
    for bad in ("", "dra,dra", "dra,x", "both"):
        with pytest.raises(argparse.ArgumentTypeError, match="give device-plugin, dra, or device-plugin,dra"):
            kube_replay.parse_modes(bad)
