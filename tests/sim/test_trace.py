"""Reading the Alibaba trace format and turning trace rows into nodes and user-written pods."""

from __future__ import annotations

import pathlib

import pytest

from gpuslice import contract as contract_
from gpuslice.sim import trace

TINY = pathlib.Path(__file__).parents[1] / "data" / "trace"
CONTRACT = contract_.Contract()


def test_the_tiny_node_list_is_read_with_models_and_gpu_counts() -> None:
    nodes = trace.load_nodes(TINY / "tiny_nodes.csv")
    assert [(n.name, n.gpus, n.model) for n in nodes] == [
        ("tiny-node-0", 2, "T4"),
        ("tiny-node-1", 2, "T4"),
        ("tiny-node-2", 4, "V100M32"),
        ("tiny-node-3", 1, "P100"),
    ]
    assert nodes[2].cpu_milli == 64000 and nodes[2].memory_mib == 262144


def test_the_tiny_pod_list_is_read_with_shares_whole_gpus_and_gpu_specs() -> None:
    pods = {p.name: p for p in trace.load_pods(TINY / "tiny_pods.csv")}
    assert pods["tiny-pod-0"].is_sharing and pods["tiny-pod-0"].gpu_demand_milli == 500
    assert pods["tiny-pod-2"].num_gpu == 2 and pods["tiny-pod-2"].gpu_demand_milli == 2000
    assert pods["tiny-pod-3"].num_gpu == 0 and pods["tiny-pod-3"].gpu_demand_milli == 0
    assert pods["tiny-pod-4"].gpu_spec == ("V100M16", "V100M32")
    assert not pods["tiny-pod-4"].is_sharing


@pytest.mark.parametrize(
    ("header", "row", "problem"),
    [
        ("name,cpu_milli,memory_mib,num_gpu", "p,1,1,1", "missing column(s) gpu_milli"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli", "p,lots,1,1,500", "cpu_milli must be an integer, got 'lots'"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli", "p,1,1,1,1500", "gpu_milli must be 0..1000, got 1500"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli", "p,1,1,2,500", "num_gpu 2 must have gpu_milli 1000"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli", "p,1,-5,0,0", "memory_mib must not be negative"),
    ],
    ids=["missing-column", "not-a-number", "share-above-one", "multi-gpu-share", "negative"],
)
def test_a_malformed_pod_list_is_refused_with_file_line_and_column(
    tmp_path: pathlib.Path, header: str, row: str, problem: str
) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(f"{header}\n{row}\n")
    with pytest.raises(trace.TraceError, match="pods.csv") as caught:
        trace.load_pods(path)
    assert problem in str(caught.value)


def test_a_node_with_an_unknown_gpu_model_is_refused_naming_the_known_models(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,1000,1024,1,H800\n")
    with pytest.raises(trace.TraceError, match=r"nodes.csv:2: GPU model 'H800' has no assumed memory; known: T4"):
        trace.load_nodes(path)


def test_a_missing_trace_directory_names_the_flag_the_variable_and_the_default(tmp_path: pathlib.Path) -> None:
    with pytest.raises(trace.TraceError) as caught:
        trace.find_trace_dir(None, {}, tmp_path / "repo")
    message = str(caught.value)
    assert "--trace-dir" in message and "GPUSLICE_TRACE_DIR" in message
    assert str(tmp_path / "shared" / "data" / "alibaba-gpu-2023") in message


def test_the_trace_directory_comes_from_the_flag_before_the_environment(tmp_path: pathlib.Path) -> None:
    # A trace directory laid out like the real one, from the synthetic fixture (no trace data in the repo).
    laid_out = tmp_path / "trace"
    laid_out.mkdir()
    (laid_out / trace.DEFAULT_NODE_FILE).write_text((TINY / "tiny_nodes.csv").read_text())
    (laid_out / trace.DEFAULT_POD_FILE).write_text((TINY / "tiny_pods.csv").read_text())
    assert trace.find_trace_dir(laid_out, {"GPUSLICE_TRACE_DIR": str(tmp_path)}, tmp_path) == laid_out
    assert trace.find_trace_dir(None, {"GPUSLICE_TRACE_DIR": str(laid_out)}, tmp_path) == laid_out


def test_trace_files_look_for_the_directory_only_for_a_file_not_given(tmp_path: pathlib.Path) -> None:
    laid_out = tmp_path / "trace"
    laid_out.mkdir()
    (laid_out / trace.DEFAULT_NODE_FILE).write_text((TINY / "tiny_nodes.csv").read_text())
    given = str(TINY / "tiny_pods.csv")
    # Both given: no trace directory anywhere, and none needed.
    assert trace.trace_files("n.csv", given, None, {}, tmp_path / "repo") == (
        pathlib.Path("n.csv"),
        TINY / "tiny_pods.csv",
    )
    assert trace.trace_files(None, given, str(laid_out), {}, tmp_path) == (
        laid_out / trace.DEFAULT_NODE_FILE,
        TINY / "tiny_pods.csv",
    )
    with pytest.raises(trace.TraceError, match="--trace-dir"):
        trace.trace_files(None, given, None, {}, tmp_path / "repo")


def test_trace_nodes_become_inventories_with_the_assumed_memory_and_stable_uuids() -> None:
    node = trace.load_nodes(TINY / "tiny_nodes.csv")[0]
    first, again = trace.node_inventory(node), trace.node_inventory(node)
    assert [g.memory_mib for g in first.gpus] == [15360, 15360]
    assert [g.model for g in first.gpus] == ["T4", "T4"]
    assert [g.uuid for g in first.gpus] == [g.uuid for g in again.gpus]
    assert len({g.uuid for g in first.gpus}) == 2
    # The memory-unit device IDs built from these UUIDs stay within kubelet's limit.
    assert (
        len(contract_.unit_device_id(first.gpus[0].uuid, 59, contract_.DEFAULT_UNIT_MIB))
        <= contract_.MAX_DEVICE_ID_LENGTH
    )


def _pod(**fields: object) -> trace.TracePod:
    base: dict[str, object] = {"name": "p", "cpu_milli": 2000, "memory_mib": 4096, "num_gpu": 1, "gpu_milli": 1000}
    base.update(fields)
    return trace.TracePod(**base)  # type: ignore[arg-type]


def test_a_sharing_pod_carries_the_gpu_fraction_annotation_and_no_whole_gpu() -> None:
    manifest = trace.user_pod(_pod(gpu_milli=460), CONTRACT)
    assert manifest["metadata"]["annotations"] == {"gpu-fraction": "0.46"}
    container = manifest["spec"]["containers"][0]
    assert container["resources"] == {"requests": {"cpu": "2000m", "memory": "4096Mi"}}


def test_a_multi_gpu_pod_asks_for_whole_nvidia_gpus() -> None:
    manifest = trace.user_pod(_pod(num_gpu=4), CONTRACT)
    assert "annotations" not in manifest["metadata"]
    assert manifest["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "4"}


def test_without_sharing_a_sharing_pod_takes_one_whole_gpu() -> None:
    manifest = trace.user_pod(_pod(gpu_milli=250), CONTRACT, whole_gpus_only=True)
    assert "annotations" not in manifest["metadata"]
    assert manifest["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}


def test_a_cpu_only_pod_with_no_memory_leaves_the_memory_request_unset() -> None:
    manifest = trace.user_pod(_pod(num_gpu=0, gpu_milli=0, memory_mib=0), CONTRACT)
    assert manifest["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "2000m"}}
    assert "affinity" not in manifest["spec"]


def test_a_gpu_spec_becomes_required_affinity_on_the_product_label() -> None:
    manifest = trace.user_pod(_pod(gpu_spec=("V100M16", "V100M32")), CONTRACT)
    terms = manifest["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "gpuslice.io/gpu.product", "operator": "In", "values": ["V100M16", "V100M32"]}]}
    ]


@pytest.mark.tracedata
def test_the_real_trace_has_the_published_node_gpu_and_pod_counts(trace_dir: pathlib.Path) -> None:
    nodes = trace.load_nodes(trace_dir / trace.DEFAULT_NODE_FILE)
    pods = trace.load_pods(trace_dir / trace.DEFAULT_POD_FILE)
    assert len(nodes) == 1213
    assert sum(n.gpus for n in nodes) == 6212
    assert len(pods) == 8152
    assert {n.model for n in nodes} <= set(trace.GPU_MEMORY_MIB)
    # Total GPU demand is about 98% of capacity (PROVENANCE.md).
    assert 0.97 < sum(p.gpu_demand_milli for p in pods) / 6212000 < 0.99
