"""The device plugin picks its node's configuration from its Node's `<prefix>/config` label."""

from __future__ import annotations

import contextlib
import http.server
import json
import logging
import pathlib
import threading
from collections.abc import Iterator

import pytest

from gpuslice import config
from gpuslice.deviceplugin import main
from gpuslice.node import labeller, nodeconfig

# tests/conftest.py has the same; a test module cannot import it (tests/e2e has a conftest too).
EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "gpuslice" / "examples"

LABEL = "gpuslice.io/config"
NODE = "gpu-node-1"
CONFIG = "version: v1\nnodeConfigs:\n  mig-single: {migStrategy: single}\n  cdi: {deviceListStrategy: cdi-cri}\n"


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    return path


def argv(config_file, tmp_path, *extra: str) -> list[str]:
    return [
        "--config",
        str(config_file),
        "--node-file",
        str(EXAMPLES / "demo-node.yaml"),
        "--kubelet-dir",
        str(tmp_path / "plugins"),
        "--http-port",
        "0",
        "--node-name",
        NODE,
        *extra,
    ]


def labels_of(labels: dict[str, str]):
    def read(node_name: str) -> dict[str, str]:
        assert node_name == NODE
        return labels

    return read


def chosen(args: list[str], read) -> config.Config:
    settings, options, _ = main.parse_args(args)
    return main.node_settings(args, settings, options, read_labels=read)


def test_the_label_names_the_entry_layered_over_the_file(config_file, tmp_path):
    settings = chosen(argv(config_file, tmp_path), labels_of({LABEL: "mig-single", "other": "x"}))
    assert (settings.mig_strategy, settings.node_config) == ("single", "mig-single")


def test_a_flag_still_wins_over_the_labelled_entry(config_file, tmp_path):
    settings = chosen(argv(config_file, tmp_path, "--mig-strategy", "none"), labels_of({LABEL: "mig-single"}))
    assert (settings.mig_strategy, settings.node_config) == ("none", "mig-single")


def test_without_the_label_the_file_applies(config_file, tmp_path):
    settings = chosen(argv(config_file, tmp_path), labels_of({}))
    assert (settings.mig_strategy, settings.node_config) == ("mixed", "")


def test_a_label_naming_no_entry_names_the_label_the_value_and_the_entries(config_file, tmp_path):
    with pytest.raises(nodeconfig.NodeConfigError) as error:
        chosen(argv(config_file, tmp_path), labels_of({LABEL: "mig-singel"}))
    assert str(error.value).startswith(
        f"node {NODE} has label {LABEL}='mig-singel', which names no entry of nodeConfigs (known: cdi, mig-single)"
    )


def test_a_label_without_any_node_configs_is_an_error_too(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("version: v1\n")
    with pytest.raises(nodeconfig.NodeConfigError, match="known: none: config.nodeConfigs is empty"):
        chosen(argv(empty, tmp_path), labels_of({LABEL: "mig-single"}))


def failing(node_name: str) -> dict[str, str]:
    raise labeller.NodeApiError(f"GET node {node_name}: HTTP 403 Forbidden")


def test_an_unreadable_node_stops_the_plugin_only_when_there_is_a_choice_to_make(config_file, tmp_path, caplog):
    with pytest.raises(nodeconfig.NodeConfigError, match=f"cannot read node {NODE}'s label {LABEL} .*HTTP 403"):
        chosen(argv(config_file, tmp_path), failing)
    empty = tmp_path / "empty.yaml"
    empty.write_text("version: v1\n")
    with caplog.at_level(logging.WARNING):
        assert chosen(argv(empty, tmp_path), failing).node_config == ""
    assert "HTTP 403" in caplog.text


def test_without_a_node_name_no_label_is_read(config_file, tmp_path):
    args = [a for a in argv(config_file, tmp_path) if a not in ("--node-name", NODE)]
    assert chosen(args, failing).node_config == ""


@contextlib.contextmanager
def api_server(labels: dict[str, str]) -> Iterator[int]:
    """A Kubernetes API server that knows one Node, on a free port."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            found = self.path.split("?")[0] == f"/api/v1/nodes/{NODE}"
            body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": labels}}
            data = json.dumps(body if found else {"kind": "Status", "code": 404}).encode()
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="fake-api-server", daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_the_plugin_reads_its_node_from_the_api_server_and_refuses_an_unknown_name(
    config_file, tmp_path, capsys, monkeypatch
):
    with api_server({LABEL: "typo"}) as port:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
            f"clusters: [{{name: fake, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
            "users: [{name: fake, user: {token: fake}}]\n"
            "contexts: [{name: fake, context: {cluster: fake, user: fake}}]\n"
        )
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        # the client reads $KUBECONFIG when it is imported, maybe before this test
        kube_config = pytest.importorskip("kubernetes.config.kube_config")
        monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "")
        assert nodeconfig.api_labels(NODE) == {LABEL: "typo"}
        assert main.main(argv(config_file, tmp_path)) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"gpuslice-device-plugin: node {NODE} has label {LABEL}='typo', which names no entry of nodeConfigs "
        f"(known: cdi, mig-single): correct the label or add the entry ({nodeconfig.DOCS})"
    )
    assert not (tmp_path / "plugins").exists()  # refused before anything was served
