"""Per-node configuration: the device plugin's own Node names, with its `<prefix>/config` label,
the entry of the file's `nodeConfigs` to layer over the file (NVIDIA's plugin selects a named
configuration the same way, with `nvidia.com/device-plugin.config`).

Precedence: flag > environment > named node configuration > file > defaults (gpuslice.config).
The label is read once, at start-up; a changed label takes effect when the plugin restarts.

A label that names no entry stops the plugin (`NodeConfigError`, one line, exit 2), as NVIDIA's
config manager does: a node labelled for a special layout (MIG `single`, CDI) but served with the
default configuration would advertise resources its pods do not ask for, and a crash-looping pod
is seen where a log line is not. A Node that cannot be read is the same error when the file has
`nodeConfigs` (the choice matters), and only a warning when it has none.

May import gpuslice.{config,contract,kubeclient} and gpuslice.node.labeller (NodeApiError).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from gpuslice import config as config_
from gpuslice import kubeclient
from gpuslice.node import labeller

__all__ = ["NodeConfigError", "api_labels", "select"]

log = logging.getLogger(__name__)

DOCS = 'docs/configuration.md, "Per-node configuration"'


class NodeConfigError(Exception):
    """The plugin must not start: its node's configuration cannot be chosen. One line."""


def select(
    settings: config_.Config,
    node_name: str,
    *,
    read_labels: Callable[[str], Mapping[str, str]],
    reload: Callable[[str], config_.Config],
) -> config_.Config:
    """`settings`, or `reload(name)` (the same sources with the node configuration `name` layered
    in) when the node's label names one. `read_labels` raises labeller.NodeApiError on failure."""
    names = settings.node_config_names
    key = settings.contract.label_node_config
    if not node_name:
        if names:
            log.warning(
                "no --node-name / NODE_NAME: label %s not read, nodeConfigs (%s) not applied", key, ", ".join(names)
            )
        return settings
    try:
        labels = read_labels(node_name)
    except labeller.NodeApiError as exc:
        if not names:
            log.warning("cannot read node %s (%s); the file has no nodeConfigs, so its settings apply", node_name, exc)
            return settings
        raise NodeConfigError(
            f"cannot read node {node_name}'s label {key} to choose among nodeConfigs ({', '.join(names)}): {exc}"
        ) from None
    name = labels.get(key, "")
    if not name:
        if names:
            log.info(
                "node %s has no label %s: the file's settings apply (nodeConfigs: %s)", node_name, key, ", ".join(names)
            )
        return settings
    try:
        chosen = reload(name)
    except config_.UnknownNodeConfig as exc:
        known = ", ".join(exc.known) or "none: config.nodeConfigs is empty"
        raise NodeConfigError(
            f"node {node_name} has label {key}={name!r}, which names no entry of nodeConfigs (known: {known}): "
            f"correct the label or add the entry ({DOCS})"
        ) from None
    except config_.ConfigError as exc:
        raise NodeConfigError(f"configuration error with node configuration {name!r}: {exc}") from None
    log.info("node %s: label %s=%s layers nodeConfigs.%s over the file", node_name, key, name, name)
    return chosen


def api_labels(
    node_name: str, *, attempts: int = 3, retry_seconds: float = 1.0, timeout: float = 10.0
) -> dict[str, str]:
    """The Node's labels from the API server (retried: the API server may be restarting);
    labeller.NodeApiError names what failed."""
    error = ""
    for attempt in range(attempts):
        if attempt:
            time.sleep(retry_seconds)
        try:
            return _read_labels(node_name, timeout)
        except labeller.NodeApiError as exc:
            error = str(exc)
    raise labeller.NodeApiError(error)


def _read_labels(node_name: str, timeout: float) -> dict[str, str]:
    import kubernetes  # imported here: only the production path needs it
    import urllib3

    client: Any = None
    try:
        client = kubeclient.default_api_client()
        node = kubernetes.client.CoreV1Api(client).read_node(node_name, _request_timeout=timeout)
        return dict((node.metadata.labels if node.metadata else None) or {})
    except kubernetes.client.ApiException as exc:
        raise labeller.NodeApiError(f"GET node {node_name}: HTTP {exc.status} {exc.reason}") from None
    except kubernetes.config.ConfigException as exc:
        raise labeller.NodeApiError(f"no Kubernetes credentials (in-cluster or kubeconfig): {exc}") from None
    except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
        raise labeller.NodeApiError(f"GET node {node_name}: {type(exc).__name__}: {exc}") from None
    finally:
        if client is not None:
            client.close()
