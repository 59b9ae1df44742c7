"""The answer seam (webhook/answerinputs.py): shape reads come from the view and move
`shape_generation` only when they change; decisions are recorded with a way to take them again,
the CPU-pod band among them; and nothing below mutation.mutate is handed the cluster view."""

from __future__ import annotations

import ast
import pathlib

from gpuslice import config
from gpuslice.node import labels as node_labels
from gpuslice.node import nodefile
from gpuslice.webhook import answerinputs, cluster

SETTINGS = config.Config()
ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "gpuslice" / "examples"


def view() -> cluster.ClusterView:
    cv = cluster.ClusterView(SETTINGS.contract, default_gpu_memory_mib=SETTINGS.default_gpu_memory_mib)
    cv.update_node("demo", node_labels.node_labels(nodefile.load(EXAMPLES / "demo-node.yaml"), SETTINGS.contract))
    return cv


def test_shape_reads_are_the_views_and_the_shape_is_computed_from_them() -> None:
    cv = view()
    inputs = cv.inputs
    assert isinstance(inputs, answerinputs.Inputs)
    assert inputs.classes() == cv.classes() and inputs.mig_profiles() == cv.mig_profiles()
    assert inputs.pacer_absent == cv.pacer_absent
    first = inputs.shape_generation
    assert inputs.shape_generation == first  # nothing changed: the same shape, not recomputed
    cv.set_pacer("")
    assert inputs.pacer_absent == "" and inputs.shape_generation != first


def test_decisions_are_recorded_only_while_recording_with_a_way_to_take_them_again() -> None:
    inputs = view().inputs
    answers = iter([1, 2, 3])
    assert inputs.decided(lambda: next(answers)) == 1  # not recording: nothing kept
    reads = inputs.start_recording()
    try:
        assert inputs.decided(lambda: next(answers)) == 2
    finally:
        inputs.stop_recording()
    assert inputs.decided(lambda: 7) == 7
    ((again, value),) = reads
    assert value == 2 and again() == 3  # taken again, it reads afresh


def test_the_cpu_pod_band_is_a_decision_that_follows_the_cpu_admitted() -> None:
    cv = view()
    inputs = cv.inputs
    reads = inputs.start_recording()
    try:
        assert inputs.cpu_pods_band(25) is False  # fewer than MIN_PODS pods counted
    finally:
        inputs.stop_recording()
    ((again, value),) = reads
    for _ in range(600):
        cv.cpu_demand.note(4000, device=False)
    assert value is False and again() is True  # a remembered answer would see the band moved


def test_the_classes_with_cpu_for_a_pod_are_a_decision_that_follows_labels_and_promises() -> None:
    cv = view()  # the demo node: 2 x H100 (81559 MiB, 318 units each)
    labels = node_labels.node_labels(nodefile.load(EXAMPLES / "demo-node.yaml"), SETTINGS.contract)
    cv.update_node("demo", {**labels, SETTINGS.contract.label_free_cpu_milli: "32000"})  # 16 cores per free GPU
    inputs = cv.inputs
    reads = inputs.start_recording()
    try:
        assert inputs.classes_with_cpu((81559, 143771), 16000.0) == (81559,)  # no H200 node: nothing free there
    finally:
        inputs.stop_recording()
    ((again, value),) = reads
    cv.ledger.promise(81559, 159, cpu_milli=12000)  # half a GPU and 12 cores in flight: 20 cores for 1.5 GPUs
    assert value == (81559,) and again() == ()
    assert inputs.classes_with_cpu((81559,), 13000.0) == (81559,)
    cv.update_node("demo", labels)  # no CPU headroom published: not judged by it
    assert inputs.classes_with_cpu((81559,), 10**9) == (81559,)


def test_the_cpu_per_free_gpu_through_the_seam_is_the_views_and_with_cpu_keeps_the_unknown() -> None:
    cv = view()
    labels = node_labels.node_labels(nodefile.load(EXAMPLES / "demo-node.yaml"), SETTINGS.contract)
    cv.update_node("demo", {**labels, SETTINGS.contract.label_free_cpu_milli: "32000"})
    assert cv.inputs.cpu_per_free_gpu() == cv.cpu_per_free_gpu() == {81559: 16000.0}
    ratios = {81559: 16000.0, 143771: None, 40960: 0.0}
    assert answerinputs.with_cpu((40960, 81559, 143771, 97871), ratios, 16000.0) == (81559, 143771)
    assert answerinputs.with_cpu((81559,), ratios, 16000.5) == ()


def test_the_owner_is_the_seams_and_each_view_has_one_seam() -> None:
    a, b = view(), view()
    a.inputs.owner = "rs-uid"
    assert b.inputs.owner == "" and a.inputs is a.inputs
    assert a.inputs.shape_generation != b.inputs.shape_generation  # unique across views


# The steps of a conversion and the steering: handed the seam, never the view.
_BELOW_MUTATION = ("classchoice", "shares", "wholegpus", "foreign", "cpupods", "patches", "dra_claims")


def test_nothing_below_mutation_imports_the_cluster_view() -> None:
    # import-linter checks the same ("answer-seam" in pyproject.toml); this names the modules.
    webhook = ROOT / "webhook"
    files = [webhook / f"{name}.py" for name in _BELOW_MUTATION] + sorted((webhook / "steering").glob("*.py"))
    for file in files:
        tree = ast.parse(file.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names = {alias.name for alias in node.names}
                assert not (node.module == "gpuslice.webhook" and "cluster" in names), file.name
                assert node.module != "gpuslice.webhook.cluster", file.name
