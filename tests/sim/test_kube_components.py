"""The components a replay on the real control plane runs (sim/kube_components.py): the scheduler's
configuration made from the model's profiles, and the webhook's config.yaml made from the settings.
The processes themselves start in tests/e2e (conftest.py, test_real_replay.py)."""

from __future__ import annotations

import dataclasses
import pathlib

from gpuslice import config
from gpuslice.sim import kube_components, replay


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
