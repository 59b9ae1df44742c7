"""gpuslice/kubeclient.py: in-cluster credentials, else the kubeconfig kubectl would read; when
neither loads, one error naming every path it tried and what to do."""

from __future__ import annotations

import os
import pathlib

import kubernetes
import pytest
import yaml

from gpuslice import kubeclient


@pytest.fixture
def outside_a_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> pathlib.Path:
    """No ServiceAccount environment, $KUBECONFIG unset and an empty home: returns the home."""
    for name in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "KUBECONFIG"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def error_of(call) -> str:
    with pytest.raises(kubernetes.config.ConfigException) as raised:
        call()
    return str(raised.value)


def test_without_a_kubeconfig_the_error_names_the_default_path_and_what_to_do(outside_a_cluster):
    message = error_of(kubeclient.default_api_client)
    assert f"no kubeconfig at {outside_a_cluster / '.kube' / 'config'}" in message
    assert "$KUBECONFIG being unset" in message
    assert "not in a cluster (Service host/port is not set)" in message
    assert "point $KUBECONFIG at a kubeconfig file" in message


def test_a_kubeconfig_variable_naming_missing_files_is_named_file_by_file(outside_a_cluster, monkeypatch, tmp_path):
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(first), str(second)]))
    message = error_of(kubeclient.default_api_client)
    assert f"none of these kubeconfigs exists: {first}, {second} ($KUBECONFIG)" in message


def test_a_kubeconfig_that_does_not_load_is_named_with_the_reason(outside_a_cluster, monkeypatch, tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("clusters: [")
    monkeypatch.setenv("KUBECONFIG", str(broken))
    message = error_of(kubeclient.default_api_client)
    assert f"the kubeconfig {broken} ($KUBECONFIG) could not be loaded" in message


def test_a_kubeconfig_that_loads_gives_a_client_for_its_server(outside_a_cluster):
    config_dir = outside_a_cluster / ".kube"
    config_dir.mkdir()
    (config_dir / "config").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    client = kubeclient.default_api_client()
    assert client.configuration.host == "https://127.0.0.1:6443"


def test_the_paths_are_those_kubectl_reads() -> None:
    paths, origin = kubeclient.kubeconfig_paths({"KUBECONFIG": os.pathsep.join(["/a", "", "/b"])})
    assert paths == [pathlib.Path("/a"), pathlib.Path("/b")] and origin == "$KUBECONFIG"
    paths, origin = kubeclient.kubeconfig_paths({})
    assert paths == [pathlib.Path("~/.kube/config").expanduser()] and "unset" in origin


def test_a_lazy_core_api_is_made_once_over_the_client_given_and_leaves_that_client_to_its_owner() -> None:
    closed: list[bool] = []
    given = kubernetes.client.ApiClient(kubernetes.client.Configuration(host="http://127.0.0.1:1"))
    given.close = lambda: closed.append(True)  # type: ignore[method-assign]
    lazy = kubeclient.LazyCoreApi(given)
    assert lazy() is lazy() and lazy().api_client is given
    lazy.close()
    assert closed == []  # the caller's client is the caller's to close
