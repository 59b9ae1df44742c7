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
    ids=[
        "kubernetes-io",
        "kubernetes-io-subdomain",
        "kubernetes-io-suffix",
        "k8s-io",
        "k8s-io-subdomain",
        "quota-prefix",
        "leading-dash",
        "empty-label",
        "too-long",
    ],
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


def test_each_component_shows_only_the_flags_of_the_keys_it_reads() -> None:
    import argparse

    def flags(component: str | None) -> set[str]:
        parser = argparse.ArgumentParser()
        config.add_arguments(parser, component)
        return {option for action in parser._actions for option in action.option_strings}

    everything = flags(None)
    webhook, plugin, dra = flags("webhook"), flags("device-plugin"), flags("dra-plugin")
    controller = flags("controller")
    assert "--mps-enabled" in plugin and "--mps-enabled" not in webhook
    # The pacer's timing and the requeuer's are the controller's alone; its Lease the webhook reads too.
    assert "--pacing-max-in-flight" in controller and "--pacing-max-in-flight" not in webhook | plugin | dra
    assert "--requeue-max-attempts" in controller and "--requeue-max-attempts" not in webhook | plugin | dra
    assert "--controller-lease-name" in controller & webhook
    assert "--convert-whole-gpus" in webhook and "--convert-whole-gpus" not in plugin | dra
    assert "--dra-slice-min-interval-seconds" in dra and "--dra-slice-min-interval-seconds" not in plugin | webhook
    assert {"--config", "--resource-prefix", "--memory-unit-mib"} <= webhook & plugin & dra
    assert webhook | plugin | dra | controller == everything  # every key is read by some component
    with pytest.raises(ValueError, match="unknown component"):
        flags("scheduler")


def test_webhook_connection_bounds_have_defaults_and_are_read_from_a_file(tmp_path):
    assert config.load(environ={}).webhook == config.WebhookConfig(
        idle_timeout_seconds=120.0,
        body_timeout_seconds=10.0,
        tls_handshake_timeout_seconds=10.0,
        max_connection_age_seconds=600.0,
        max_connections=1000,
    )
    path = write(tmp_path, "webhook:\n  idleTimeoutSeconds: 30\n  maxConnections: 50\n")
    c = config.load(path, environ={"GPUSLICE_WEBHOOK_BODY_TIMEOUT_SECONDS": "2.5"})
    assert (c.webhook.idle_timeout_seconds, c.webhook.max_connections, c.webhook.body_timeout_seconds) == (30, 50, 2.5)
    with pytest.raises(config.ConfigError, match="webhook.maxConnections: must be greater than 0"):
        config.load(overrides={"webhook.maxConnections": 0}, environ={})


def test_converted_pod_tolerations_default_to_the_gpu_taint_and_come_from_yaml_or_json(tmp_path):
    gpu = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert config.load(environ={}).converted_pod_tolerations == (gpu,)
    path = write(tmp_path, "convertedPodTolerations:\n- {key: dedicated, operator: Equal, value: gpu}\n")
    assert config.load(path, environ={}).converted_pod_tolerations == (
        {"key": "dedicated", "operator": "Equal", "value": "gpu"},
    )
    env = {"GPUSLICE_CONVERTED_POD_TOLERATIONS": '[{"operator": "Exists"}]'}
    assert config.load(environ=env).converted_pod_tolerations == ({"operator": "Exists"},)
    assert config.load(overrides={"convertedPodTolerations": []}, environ={}).converted_pod_tolerations == ()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("not json", "must be a JSON list of objects"),
        ('["nvidia.com/gpu"]', "must be a list of objects"),
        ('[{"key": "a", "operator": "Exists", "value": "v"}]', "operator Exists takes no value"),
        ('[{"key": "a", "operator": "Like"}]', "operator must be one of Exists, Equal"),
        ('[{"key": "a", "operator": "Exists", "effect": "Never"}]', "effect must be one of"),
        ('[{"key": "a", "operator": "Exists", "tolerationSeconds": 5}]', "tolerationSeconds needs effect NoExecute"),
        ('[{"key": "a b", "operator": "Exists"}]', "not a valid label key"),
        ('[{"value": "x"}]', "without a key the operator must be Exists"),
        ('[{"key": "a", "operator": "Exists", "colour": "red"}]', "unknown field 'colour'"),
    ],
    ids=["not-json", "strings", "exists-with-value", "operator", "effect", "seconds", "key", "no-key", "unknown"],
)
def test_bad_tolerations_are_refused_at_start_up_with_the_reason(value, message):
    with pytest.raises(config.ConfigError, match=f"convertedPodTolerations: .*{message}"):
        config.load(environ={"GPUSLICE_CONVERTED_POD_TOLERATIONS": value})


def test_cpu_per_gpu_is_bounded_with_the_range_said():
    assert config.load(overrides={"steering.cpuPerGpuMilli": 0}, environ={}).steering.cpu_per_gpu_milli == 0
    for bad in (-1, config.MAX_CPU_PER_GPU_MILLI + 1):
        with pytest.raises(
            config.ConfigError, match=f"steering.cpuPerGpuMilli: must be 0 to {config.MAX_CPU_PER_GPU_MILLI}"
        ):
            config.load(overrides={"steering.cpuPerGpuMilli": bad}, environ={})


def test_the_nearly_full_bound_of_cpu_pods_is_bounded_with_the_range_said():
    loaded = config.load(environ={"GPUSLICE_STEERING_CPU_PODS_NEARLY_FULL_MIB": "8192"})
    assert loaded.steering.cpu_pods_nearly_full_mib == 8192
    assert config.Config().steering.cpu_pods_nearly_full_mib == 8192
    for bad in (-1, config.MAX_NEARLY_FULL_MIB + 1):
        with pytest.raises(
            config.ConfigError, match=f"steering.cpuPodsNearlyFullMiB: must be 0 to {config.MAX_NEARLY_FULL_MIB}"
        ):
            config.load(overrides={"steering.cpuPodsNearlyFullMiB": bad}, environ={})


@pytest.mark.parametrize("component", [None, *config.COMPONENTS])
def test_every_component_s_help_renders(component):
    """argparse formats help texts with %: a bare one in a field's description breaks --help."""
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, component)
    text = parser.format_help()
    assert all(field.flag in text for field in config.FIELDS if config.reads(component, field))
