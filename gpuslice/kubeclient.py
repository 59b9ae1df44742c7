"""The Kubernetes API client every component uses when none is given: the pod's ServiceAccount
in a cluster, else the kubeconfig ($KUBECONFIG or ~/.kube/config), as kubectl would.

May import only the kubernetes client (loaded on first use: tests with fakes never pay for it).
"""

from __future__ import annotations

from typing import Any

__all__ = ["default_api_client"]


def default_api_client() -> Any:
    """A kubernetes.client.ApiClient: in-cluster configuration, else the kubeconfig."""
    import kubernetes

    configuration = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(client_configuration=configuration)
    return kubernetes.client.ApiClient(configuration)
