"""The parts of `gpuslice-sim --scheduler kube` that need no control plane: arrival modes, node
sampling, the scheduler configuration and the webhook's config.yaml made from the model's settings,
the trace's inter-arrival gaps, and the command line's errors. The replay itself runs in
tests/e2e/test_real_replay.py."""

from __future__ import annotations

import argparse
import dataclasses
import io
import pathlib

import pytest

from gpuslice import config
from gpuslice import contract as contract_
from gpuslice.sim import (
    controlplane,
    kube_arrivals,
    kube_cli,
    kube_components,
    kube_dra,
    kube_nodes,
    kube_outcomes,
    kube_replay,
    main,
    placements,
    replay,
    trace,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("sequential", kube_arrivals.Arrival("sequential")),
        ("burst", kube_arrivals.Arrival("burst")),
        ("compressed:3600", kube_arrivals.Arrival("compressed", 3600.0)),
    ],
)
def test_arrival_modes(text: str, expected: kube_arrivals.Arrival) -> None:
    assert kube_arrivals.parse_arrival(text) == expected
    assert str(kube_arrivals.parse_arrival(text)) == text


@pytest.mark.parametrize("text", ["", "bursty", "compressed", "compressed:0", "compressed:-2", "compressed:x"])
def test_a_bad_arrival_mode_is_named(text: str) -> None:
    with pytest.raises(ValueError, match="arrival"):
        kube_arrivals.parse_arrival(text)


def test_node_sample_keeps_the_ends_and_the_order() -> None:
    nodes = [trace.TraceNode(f"n{i}", 1000, 1024, 1, "T4") for i in range(10)]
    assert [n.name for n in kube_cli.sample_nodes(nodes, 3)] == ["n0", "n4", "n9"]
    assert kube_cli.sample_nodes(nodes, None) == nodes
    assert kube_cli.sample_nodes(nodes, 50) == nodes
    with pytest.raises(ValueError, match="node-sample"):
        kube_cli.sample_nodes(nodes, 0)


def test_the_default_profile_is_kube_schedulers_own() -> None:
    profile = replay.configurations(config.Config())["gpuslice-default"].profile
    document = kube_components.scheduler_configuration(profile)
    assert document["profiles"] == [{"schedulerName": "default-scheduler"}]


def test_the_binpack_profile_scores_every_pod_as_the_model_does() -> None:
    profile = replay.configurations(config.Config())["gpuslice-binpack"].profile
    profiles = kube_components.scheduler_configuration(profile)["profiles"]
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
    path.write_text(yaml.safe_dump(kube_components.settings_document(settings)))
    assert config.load(path, environ={}) == settings


def test_trace_gaps_are_the_sorted_creation_times_differences(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time\na,1,1,0,0,30\nb,1,1,0,0,0\nc,1,1,0,0,10\n"
    )
    assert kube_arrivals.trace_gaps(path) == [10.0, 20.0]
    path.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,0,0\n")
    with pytest.raises(trace.TraceError, match="creation_time"):
        kube_arrivals.trace_gaps(path)


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


def test_a_plot_is_refused_with_the_kube_replay(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main.main(["--scheduler", "kube", "--plot", str(tmp_path / "out.png")]) == 2
    assert "--plot: only with --scheduler model" in capsys.readouterr().err
    assert not (tmp_path / "out.png").exists()


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


def _bound(name: str, units: int, contract: contract_.Contract) -> dict[str, object]:
    """A converted pod as the bound-pods watch shows it."""
    resources = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {contract.gpu_memory_resource: str(units)}}
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"nodeName": "t4", "containers": [{"name": "main", "resources": resources}]},
        "status": {"phase": "Pending"},
    }


def test_the_kube_runs_placements_hold_what_kubelet_granted_and_recompute_its_figure() -> None:
    # One node of two T4s (60 units of 256 MiB each). a and b: 36 units, one per GPU; c: 36 more
    # units span the two GPUs' 24 free each, refused by Allocate; d: unschedulable; e: denied by
    # the webhook; f: nothing seen.
    settings = config.Config()
    contract = settings.contract
    node = trace.TraceNode("t4", 64000, 262144, 2, "T4")
    fleet = kube_nodes.Fleet(None, [node], settings, sharing=True, namespace="default")  # type: ignore[arg-type]
    outcomes = kube_outcomes.Outcomes(fleet)
    arrivals = [trace.TracePod(n, 1000, 1024, 1, 600) for n in "abcdef"]
    for name in "abc":
        pod = _bound(name, 36, contract)
        fleet._decide(f"default/{name}", "t4", pod, fleet._admit(f"default/{name}", "t4", fleet.sims["t4"], pod))
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes"}
    outcomes.on_event(
        "ADDED", {"metadata": {"namespace": "default", "name": "d"}, "status": {"conditions": [unschedulable]}}
    )
    outcomes.deny("default/e", 'admission webhook "pods.gpuslice.io" denied the request: no GPU class')
    capacity = replay.gpu_capacity_milli([node])
    result, unaccounted, lost = kube_outcomes.figures(
        "gpuslice-default", arrivals, outcomes, fleet, capacity, 1.0, 1.0, placements=True
    )
    assert unaccounted == ["default/f"] and lost == 1
    records = result.placements
    assert records is not None
    assert [r["outcome"] for r in records] == ["placed", "placed", "refused", "unschedulable", "denied", "unaccounted"]
    a, b, c, d, e, _ = records
    assert a["node"] == "t4" and len(a["gpus"]) == 1 and a["gpus"][0]["uuid"] != b["gpus"][0]["uuid"]
    assert a["gpus"][0] | {"uuid": ""} == {
        "uuid": "",
        "units": 36,
        "total_units": 60,
        "unit_mib": 256,
        "gpu_memory_mib": 15360,
    }
    assert a["granted_gpus"] == pytest.approx(0.6)
    assert c["node"] == "t4" and c["gpus"] == [] and c["message"].startswith("kubelet: ") and "span" in c["message"]
    assert d["message"] == "0/1 nodes" and d["node"] is None
    assert "denied the request: no GPU class" in e["message"]
    out = io.StringIO()
    placements.write(out, [(result.name, 42, "pods.csv", result)])
    [figures] = placements.recompute(out.getvalue().splitlines())
    assert figures.matches and figures.placed == 2 and figures.pods == 6
    assert figures.gpu_allocation_ratio == pytest.approx(0.6) == pytest.approx(result.gpu_allocation_ratio)


def test_a_dra_claims_grant_is_recorded_per_device_in_mib() -> None:
    contract = config.Config().contract
    node = trace.node_inventory(trace.TraceNode("t4", 64000, 262144, 2, "T4"))
    ledger = kube_dra.DeviceLedger(contract)
    ledger.add_slices(kube_dra.node_slices(node, contract, "t4"))
    result = {"driver": contract.dra_driver, "pool": "t4", "device": "gpu-1", "consumedCapacity": {"memory": "9216Mi"}}
    claim = {"status": {"allocation": {"devices": {"results": [result]}}}}
    pool, granted, shares = ledger.grant(claim)
    assert (pool, granted) == ("t4", pytest.approx(0.6))
    assert [s.to_json() for s in shares] == [
        {"uuid": "gpu-1", "units": 9216, "total_units": 15360, "unit_mib": 1, "gpu_memory_mib": 15360}
    ]


def test_modes_are_device_plugin_dra_or_both_each_once() -> None:
    assert kube_cli.parse_modes("dra") == ("dra",)
    assert kube_cli.parse_modes("device-plugin, dra") == ("device-plugin", "dra")
    for bad in ("", "dra,dra", "dra,x", "both"):
        with pytest.raises(argparse.ArgumentTypeError, match="give device-plugin, dra, or device-plugin,dra"):
            kube_cli.parse_modes(bad)


def test_the_paced_model_converts_in_the_order_the_pods_were_stored_and_schedules_in_the_order_decided() -> None:
    # Creates answered out of order (pod 0 stored first, answered last); pod 3 denied (no version).
    feed = kube_replay.model_feed(
        decided_at=[5.0, 4.0, 6.0, 0.3],
        answered_at=[0.9, 0.1, 0.5, 0.2],
        stored=[101, 105, 103, None],
    )
    # The answer times of the stored pods, 0.1 < 0.5 < 0.9, go to them in storage order 0, 2, 1.
    assert feed.converted_at == (0.1, 0.9, 0.5, 0.2)
    assert feed.scheduled_at == (5.0, 4.0, 6.0, 0.3)
    assert feed.order == (3, 1, 0, 2)
    # Ties keep the arrival order.
    assert kube_replay.model_feed([1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1, 2, 3]).order == (2, 0, 1)


def test_the_paced_models_feed_needs_one_moment_of_each_kind_per_arrival() -> None:
    with pytest.raises(ValueError, match="per arrival"):
        kube_replay.model_feed([1.0], [0.5, 0.6], [1, 2])


def _paced_case() -> tuple[list[trace.TraceNode], list[trace.TracePod], replay.Configuration, kube_replay.ModelFeed]:
    nodes = [trace.TraceNode(f"n{i}", 32000, 131072, 2, model) for i, model in enumerate(["V100M16", "V100M32"] * 3)]
    pods = [trace.TracePod(f"p{i}", 2000, 4096, 1, milli) for i, milli in enumerate([300, 700, 450, 250, 600] * 6)]
    configuration = replay.configurations(config.Config())["gpuslice-default"]
    # A burst: every create answered in the first second, the scheduler deciding them later.
    feed = kube_replay.model_feed(
        [1.0 + 0.1 * i for i in range(len(pods))], [0.03 * i for i in range(len(pods))], list(range(len(pods)))
    )
    return nodes, pods, configuration, feed


def test_the_paced_model_of_a_burst_is_the_median_of_its_draws_and_the_first_is_the_runs_own_order() -> None:
    nodes, pods, configuration, feed = _paced_case()
    median, ratios = kube_replay.paced_model(nodes, pods, configuration, feed, seed=7, draws=5)
    assert len(ratios) == 5
    assert median.gpu_allocation_ratio == sorted(ratios)[2]
    own = replay.replay(
        nodes,
        pods,
        configuration,
        seed=7,
        label_delay=replay.LabelDelay(
            min_interval_seconds=configuration.settings.steering.label_min_interval_seconds,
            scheduled_at=feed.scheduled_at,
            converted_at=feed.converted_at,
        ),
    )
    assert ratios[0] == own.gpu_allocation_ratio
    # The same seed draws the same orders.
    assert kube_replay.paced_model(nodes, pods, configuration, feed, seed=7, draws=5)[1] == ratios


def test_the_paced_model_needs_a_draw() -> None:
    nodes, pods, configuration, feed = _paced_case()
    with pytest.raises(ValueError, match="at least one draw"):
        kube_replay.paced_model(nodes, pods, configuration, feed, seed=7, draws=0)
