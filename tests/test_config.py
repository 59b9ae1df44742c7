"""One configuration schema for both components: flag > environment > file > default."""

import argparse

import pytest

from gpuslice import config


def write(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def parse(argv):
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return parser.parse_args(argv)


def test_defaults_match_the_documented_contract():
    c = config.load(environ={})
    assert c.resource_prefix == "gpuslice.io"
    assert c.memory_unit_mib == 256
    assert c.device_list_strategy == "envvar"
    assert c.mps.enabled is False
    assert c.health.ignored_xids == (13, 31, 43, 45, 68, 109)
    assert c.contract.gpu_memory_resource == "gpuslice.io/gpu-memory"


def test_file_values_are_read_with_nested_sections(tmp_path):
    path = write(
        tmp_path,
        "version: v1\nmemoryUnitMiB: 512\nmps:\n  enabled: true\n  pipeDirectory: /tmp/mps\n"
        "health:\n  ignoredXids: [13, 48]\nignoredNamespaces: [kube-system, monitoring]\n",
    )
    c = config.load(path, environ={})
    assert c.memory_unit_mib == 512
    assert c.mps.enabled is True and c.mps.pipe_directory == "/tmp/mps"
    assert c.health.ignored_xids == (13, 48)
    assert c.ignored_namespaces == ("kube-system", "monitoring")


def test_flag_beats_environment_beats_file(tmp_path):
    path = write(tmp_path, "memoryUnitMiB: 512\ndeviceListStrategy: envvar\nmps: {enabled: false}\n")
    env = {"GPUSLICE_MEMORY_UNIT_MIB": "1024", "GPUSLICE_MPS_ENABLED": "true"}
    c = config.load(path, environ=env, args=parse(["--memory-unit-mib", "128"]))
    assert c.memory_unit_mib == 128  # flag
    assert c.mps.enabled is True  # environment over file
    assert c.device_list_strategy == "envvar"  # file


def test_from_args_reads_the_config_flag(tmp_path):
    path = write(tmp_path, "resourcePrefix: example.com\n")
    c = config.from_args(parse(["--config", str(path)]), environ={})
    assert c.resource_prefix == "example.com"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("memoryUnitMiB: 0\n", "memoryUnitMiB: must be greater than 0"),
        ("memoryUnitMiB: lots\n", "memoryUnitMiB: must be an integer"),
        ("deviceListStrategy: volume-mounts\n", "deviceListStrategy: must be one of envvar, cdi-cri"),
        ("memoryUnitMb: 256\n", "memoryUnitMb: unknown key (did you mean memoryUnitMiB?)"),
        ("mps: {enabled: maybe}\n", "mps.enabled: must be true or false"),
        ("mps: {pipeDirectory: relative/dir}\n", "mps.pipeDirectory: must be an absolute path"),
        ("resourcePrefix: GPUSLICE\n", "resourcePrefix: must be a DNS subdomain"),
        ("version: v2\n", "version: must be 'v1'"),
        ("- a\n- b\n", "must hold a mapping"),
        ("memoryUnitMiB: [\n", "not valid YAML"),
        ("health: {ignoredXids: [13, -1]}\n", "XID -1 is not a positive integer"),
    ],
)
def test_bad_files_fail_at_start_up_naming_key_and_value(tmp_path, text, message):
    with pytest.raises(config.ConfigError) as err:
        config.load(write(tmp_path, text), environ={})
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        ("kubernetes.io", "in the kubernetes.io domain, which Kubernetes reserves"),
        ("gpu.kubernetes.io", "in the kubernetes.io domain"),
        ("examplekubernetes.io", "in the kubernetes.io domain"),  # kubelet matches "kubernetes.io/" anywhere
        ("k8s.io", "in the k8s.io domain"),
        ("node.k8s.io", "in the k8s.io domain"),
        ("requests.example.com", "must not start with 'requests.'"),
        ("-bad.example.com", "must be a DNS subdomain"),
        ("example..com", "must be a DNS subdomain"),
        ("a" * 251 + ".io", "must be a DNS subdomain"),  # 254 characters
    ],
    ids=["kubernetes-io", "kubernetes-io-subdomain", "kubernetes-io-suffix", "k8s-io", "k8s-io-subdomain",
         "quota-prefix", "leading-dash", "empty-label", "too-long"],
)
def test_resource_prefixes_kubelet_would_refuse_are_refused_at_start(prefix, message):
    with pytest.raises(config.ConfigError, match="resourcePrefix") as err:
        config.load(environ={"GPUSLICE_RESOURCE_PREFIX": prefix})
    assert message in str(err.value)


@pytest.mark.parametrize("prefix", ["gpuslice.io", "gpu.example.com", "k8s.example.io", "kubernetes.example.com"])
def test_ordinary_resource_prefixes_are_accepted(prefix):
    assert config.load(environ={"GPUSLICE_RESOURCE_PREFIX": prefix}).resource_prefix == prefix


def test_bad_environment_values_name_the_variable():
    with pytest.raises(config.ConfigError, match="environment GPUSLICE_MEMORY_UNIT_MIB"):
        config.load(environ={"GPUSLICE_MEMORY_UNIT_MIB": "x"})


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(config.ConfigError, match="cannot read configuration file"):
        config.load(tmp_path / "absent.yaml", environ={})


def test_schema_table_documents_every_key():
    table = config.describe()
    for field in config.FIELDS:
        assert f"`{field.path}`" in table and field.env in table and field.flag in table
