"""The Kubernetes API client every component uses when none is given: the pod's ServiceAccount
in a cluster, else the kubeconfig ($KUBECONFIG or ~/.kube/config), as kubectl would.

May import only the kubernetes client (loaded on first use: tests with fakes never pay for it).
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from typing import Any

__all__ = ["LazyCoreApi", "core_api_from_flag", "default_api_client", "kubeconfig_paths"]

DEFAULT_KUBECONFIG = "~/.kube/config"


def kubeconfig_paths(environ: Mapping[str, str] | None = None) -> tuple[list[pathlib.Path], str]:
    """The kubeconfig files kubectl would read, and where that list came from ("$KUBECONFIG" or the
    default): every entry of $KUBECONFIG (os.pathsep-separated) when it is set, else ~/.kube/config."""
    environ = os.environ if environ is None else environ
    listed = [entry for entry in environ.get("KUBECONFIG", "").split(os.pathsep) if entry]
    if listed:
        return [pathlib.Path(entry).expanduser() for entry in listed], "$KUBECONFIG"
    return [pathlib.Path(DEFAULT_KUBECONFIG).expanduser()], "the default, $KUBECONFIG being unset"


def default_api_client() -> Any:
    """A kubernetes.client.ApiClient: in-cluster configuration, else the kubeconfig.

    When neither loads, raises kubernetes.config.ConfigException naming what was tried (the
    in-cluster error, each kubeconfig path and where the list came from) and what to do; callers
    put it after their own "no Kubernetes credentials (in-cluster or kubeconfig): ".
    """
    import kubernetes

    configuration = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    except kubernetes.config.ConfigException as in_cluster:
        _load_kubeconfig(configuration, str(in_cluster))
    return kubernetes.client.ApiClient(configuration)


def _load_kubeconfig(configuration: Any, in_cluster_error: str) -> None:
    import kubernetes

    paths, origin = kubeconfig_paths()
    shown = ", ".join(str(path) for path in paths)
    not_in_cluster = f"not in a cluster ({in_cluster_error.rstrip('.')})"
    if not any(path.is_file() for path in paths):
        missing = "no kubeconfig at" if len(paths) == 1 else "none of these kubeconfigs exists:"
        raise kubernetes.config.ConfigException(
            f"{not_in_cluster} and {missing} {shown} ({origin}); run in a pod "
            "with a ServiceAccount token, or point $KUBECONFIG at a kubeconfig file (or create ~/.kube/config)"
        )
    try:
        kubernetes.config.load_kube_config(
            config_file=os.pathsep.join(str(path) for path in paths), client_configuration=configuration
        )
    except Exception as exc:  # noqa: BLE001 - a YAML or file error too: one message naming the files
        raise kubernetes.config.ConfigException(
            f"{not_in_cluster}, and the kubeconfig {shown} ({origin}) could not be "
            f"loaded: {exc}; fix it, or point $KUBECONFIG at another kubeconfig file"
        ) from exc


def core_api_from_flag(kubeconfig: str | None = None) -> Any:
    """A kubernetes.client.CoreV1Api from a process's --kubeconfig, else the in-cluster
    ServiceAccount, else $KUBECONFIG or ~/.kube/config; None when there is no cluster to talk to
    (the webhook then uses defaultGpuMemoryMiB). Loading errors are kubernetes.config.ConfigException."""
    import kubernetes

    configuration = kubernetes.client.Configuration()
    if kubeconfig:
        kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    elif os.environ.get("KUBECONFIG") or pathlib.Path(DEFAULT_KUBECONFIG).expanduser().exists():
        kubernetes.config.load_kube_config(client_configuration=configuration)
    else:
        return None
    return kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(configuration))


class LazyCoreApi:
    """A CoreV1Api made on its first call, over `api_client` or, when none is given, the default
    client (made then too, and closed by `close()`): a component that never reaches the API server
    never loads its configuration, and tests with fakes never load the client."""

    def __init__(self, api_client: Any = None) -> None:
        self._api_client = api_client  # kubernetes.client.ApiClient; None: the default, on first use
        self._owns_client = api_client is None
        self._core: Any = None

    def __call__(self) -> Any:
        import kubernetes  # only the production path needs it loaded

        if self._core is None:
            if self._api_client is None:
                self._api_client = default_api_client()
            self._core = kubernetes.client.CoreV1Api(self._api_client)
        return self._core

    def close(self) -> None:
        if self._owns_client and self._api_client is not None:
            self._api_client.close()
