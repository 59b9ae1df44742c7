"""Simulated nodes: the YAML node file and its errors."""

import pytest

from gpuslice.node import nodefile


def test_dump_and_parse_round_trip(demo_node):
    again = nodefile.parse(__import__("yaml").safe_load(nodefile.dump(demo_node)))
    assert again.gpus == demo_node.gpus


GPU = "{uuid: GPU-a, model: T4, memoryMiB: 15360, index: 0"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpus: nope\n", "must be a mapping with a list under 'gpus'"),
        ("gpus: [{model: T4, memoryMiB: 1, index: 0}]\n", "gpus[0]: missing required key 'uuid'"),
        ("gpus: [" + GPU + ", memoryMiB: -5}]\n", None),
        ("gpus: [{uuid: GPU-a, model: T4, memoryMiB: -5, index: 0}]\n", "memoryMiB must be an integer >= 1, got -5"),
        ("gpus: [" + GPU + ", colour: red}]\n", "unknown key 'colour'"),
        ("gpus: [" + GPU + "}, " + GPU + "}]\n", "duplicate UUID GPU-a"),
        ("gpus: [" + GPU + ", nvlinks: {GPU-z: 2}}]\n", "nvlinks to unknown GPU GPU-z"),
        ("gpus: [" + GPU + ", mig: [{uuid: MIG-1, profile: big, memoryMiB: 10}]}]\n", "'big' is not a MIG profile"),
        ("gpus: [" + GPU + ", mig: [{uuid: MIG-1, profile: 1g.5gb, memoryMiB: 99999}]}]\n", "MIG devices hold 99999"),
        ("gpus: [[\n", "not valid YAML"),
    ],
)
def test_malformed_node_files_name_the_gpu_and_key(tmp_path, text, message):
    path = tmp_path / "node.yaml"
    path.write_text(text)
    if message is None:  # duplicate YAML keys: the last value wins, still invalid
        message = "memoryMiB must be an integer >= 1"
    with pytest.raises(nodefile.NodeFileError) as err:
        nodefile.load(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)
