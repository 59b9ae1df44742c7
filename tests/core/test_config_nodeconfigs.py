"""nodeConfigs: named partial configurations a node picks with its label, layered between the
file and the environment (flag > environment > node configuration > file > defaults)."""

from __future__ import annotations

import argparse
import textwrap

import pytest

from gpuslice import config

FILE = """\
version: v1
memoryUnitMiB: 512
migStrategy: mixed
health:
  recoveryIntervalSeconds: 60
nodeConfigs:
  mig-single:
    migStrategy: single
    health:
      eventTimeoutMs: 1000
  cdi:
    deviceListStrategy: cdi-cri
    cdiKind: example.com/gpu
"""


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(FILE)
    return path


def test_a_named_entry_is_layered_over_the_file_and_keeps_what_it_does_not_set(config_file):
    settings = config.load(config_file, environ={}, node_config="mig-single")
    assert settings.mig_strategy == "single"
    assert settings.health.event_timeout_ms == 1000
    assert settings.health.recovery_interval_seconds == 60  # the file's, in the same section
    assert settings.memory_unit_mib == 512
    assert settings.node_config == "mig-single"
    assert settings.node_config_names == ("cdi", "mig-single")


def test_without_a_name_the_file_applies_and_the_names_are_known(config_file):
    settings = config.load(config_file, environ={})
    assert settings.mig_strategy == "mixed" and settings.device_list_strategy == "envvar"
    assert (settings.node_config, settings.node_config_names) == ("", ("cdi", "mig-single"))


def test_environment_and_flags_win_over_the_node_configuration(config_file):
    env = {"GPUSLICE_MIG_STRATEGY": "none"}
    assert config.load(config_file, environ=env, node_config="mig-single").mig_strategy == "none"
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, "device-plugin")
    args = parser.parse_args(["--config", str(config_file), "--health-event-timeout-ms", "42"])
    settings = config.from_args(args, environ=env, node_config="mig-single")
    assert (settings.health.event_timeout_ms, settings.mig_strategy) == (42, "none")


def test_an_unknown_name_says_which_names_exist(config_file):
    with pytest.raises(config.UnknownNodeConfig, match=r"no entry 'mig-singel' \(known: cdi, mig-single\)") as error:
        config.load(config_file, environ={}, node_config="mig-singel")
    assert error.value.known == ("cdi", "mig-single")
    with pytest.raises(config.UnknownNodeConfig, match="the file has no nodeConfigs"):
        config.load(environ={}, node_config="mig-single")


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ("a: {migStrategy: all}", "nodeConfigs.a.migStrategy: must be one of none, single, mixed, got 'all'"),
        ("a: {migStrategie: single}", "migStrategie: unknown key (did you mean migStrategy?)"),
        ("a: {health: {eventTimeoutMs: 0}}", "nodeConfigs.a.health.eventTimeoutMs: must be greater than 0"),
        ("a: {memoryUnitMiB: 512}", "nodeConfigs.a.memoryUnitMiB: cannot differ between nodes: the webhook reads it"),
        ("a: {mps: {enabled: true}}", "nodeConfigs.a.mps.enabled: cannot differ between nodes: the chart grants"),
        (
            "a: {convertWholeGpus: false}",
            "nodeConfigs.a.convertWholeGpus: cannot differ between nodes: only the webhook",
        ),
        ("a: {dra: {sliceResyncSeconds: 5}}", "the DRA plugin does not read node configurations"),
        ("a: {version: v1}", "nodeConfigs.a.version: an entry has no version of its own"),
        ("a: [migStrategy]", "nodeConfigs.a: must be a mapping of configuration keys"),
        ("'-bad-': {}", "'-bad-' is not a valid name: a label value"),
    ],
    ids=[
        "bad-value",
        "typo",
        "out-of-range",
        "cluster-wide-key",
        "chart-granted-key",
        "webhook-key",
        "dra-key",
        "version",
        "not-a-mapping",
        "bad-name",
    ],
)
def test_every_entry_is_validated_when_the_file_is_loaded_whichever_a_node_picks(entries, message, tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\nnodeConfigs:\n" + textwrap.indent(entries, "  ") + "\n")
    with pytest.raises(config.ConfigError) as error:
        config.load(path, environ={})  # no node configuration asked for: still checked
    assert message in str(error.value) and "\n" not in str(error.value)


def test_every_key_is_either_per_node_or_has_a_reason_not_to_be():
    for field in config.FIELDS:
        if field.path in config.PER_NODE_KEYS:
            assert config.reads("device-plugin", field), field.path
        else:
            document = {"nodeConfigs": {"a": _nested(field.path, None)}}
            with pytest.raises(config.ConfigError, match="cannot differ between nodes"):
                config._node_configs(document, "test")


def _nested(path: str, value: object) -> dict:
    head, _, rest = path.partition(".")
    return {head: _nested(rest, value) if rest else value}
