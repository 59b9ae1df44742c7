"""charts/gpuslice installed by the real helm into the real API server: defaults, cert-manager on and
off (and chosen by default where its API is served), `helm upgrade` keeping the chart-made
certificate, `helm uninstall` leaving nothing of ours, and `helm install` refused before anything is
applied without an image or with cert-manager asked for where it is not installed.

The API server validates every object for real here (schemas, CEL in matchConditions and in the
ValidatingAdmissionPolicy, RBAC escalation checks on the roles the chart grants).
cert-manager is not installed: its CRDs are (minimal schemas written here, which accept what the
chart sends), so the chart's Issuer and Certificate objects are stored but never issued; whether
cert-manager would accept them is cert-manager's own schema's business and is not checked.
"""

from __future__ import annotations

import pathlib
from typing import Any

import chartkit
import k8skit
import kubernetes
import pytest

from gpuslice.sim import controlplane

pytestmark = [pytest.mark.e2e, pytest.mark.helm]

INSTANCE_LABEL = "app.kubernetes.io/instance"


def _crd(group: str, kind: str, plural: str, *, namespaced: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
            "scope": "Namespaced" if namespaced else "Cluster",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def cert_manager_crds(admin: kubernetes.client.ApiClient) -> None:
    api = kubernetes.client.ApiextensionsV1Api(admin)
    for crd in (
        _crd("cert-manager.io", "Issuer", "issuers"),
        _crd("cert-manager.io", "ClusterIssuer", "clusterissuers", namespaced=False),
        _crd("cert-manager.io", "Certificate", "certificates"),
    ):
        try:
            api.create_custom_resource_definition(crd)
        except kubernetes.client.ApiException as exc:
            if exc.status != 409:
                raise

    def established() -> bool:
        for name in ("issuers.cert-manager.io", "certificates.cert-manager.io"):
            conditions = api.read_custom_resource_definition(name).status.conditions or []
            if not any(c.type == "Established" and c.status == "True" for c in conditions):
                return False
        return True

    k8skit.wait_for("cert-manager CRDs to be established", established, timeout=30)


def _ours(admin: kubernetes.client.ApiClient, release: str) -> list[str]:
    """Every object in the cluster labelled as part of `release`, over every listable resource."""
    found = []
    selector = f"{INSTANCE_LABEL}={release}"
    dynamic = kubernetes.dynamic.DynamicClient(admin)
    for resource in dynamic.resources.search():
        if "list" not in (resource.verbs or []) or "/" in resource.name or resource.kind.endswith("List"):
            continue
        if resource.group in ("events.k8s.io",) or resource.kind == "Event":
            continue
        try:
            items = dynamic.get(resource, label_selector=selector).items
        except kubernetes.client.ApiException:
            continue
        found += [f"{resource.kind}/{item.metadata.name}" for item in items]
    return sorted(set(found))


def test_the_chart_installs_with_default_values_and_uninstalls_leaving_nothing(
    cluster: controlplane.ControlPlane, admin: kubernetes.client.ApiClient, workdir: pathlib.Path
) -> None:
    release, namespace = "gs-defaults", "gs-defaults"
    k8skit.install_chart(cluster.admin_kubeconfig, release, namespace, {}, workdir)
    objects = _ours(admin, release)
    kinds = {name.split("/")[0] for name in objects}
    assert {
        "MutatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "DaemonSet",
        "Deployment",
        "Secret",
        "ConfigMap",
        "ClusterRole",
        "ClusterRoleBinding",
    } <= kinds, objects
    webhooks = kubernetes.client.AdmissionregistrationV1Api(admin).read_mutating_webhook_configuration(
        f"{release}-gpuslice-webhook"
    )
    assert [w.client_config.service.name for w in webhooks.webhooks] == [f"{release}-gpuslice-webhook"] * 2
    assert all(w.client_config.ca_bundle for w in webhooks.webhooks)

    k8skit.helm(cluster.admin_kubeconfig, "uninstall", release, "--namespace", namespace)
    leftovers = k8skit.wait_for(
        "uninstall to remove every object of the release",
        lambda: not _ours(admin, release) or None,
        timeout=60,
    )
    assert leftovers, _ours(admin, release)


def test_dra_mode_installs_with_its_device_classes_roles_and_node_policy(
    cluster: controlplane.ControlPlane, admin: kubernetes.client.ApiClient, workdir: pathlib.Path
) -> None:
    # The API server compiles the node policy's CEL (it now matches the DRA plugin's ServiceAccount
    # too) and checks that whoever installs may grant the DRA plugin's roles.
    release, namespace = "gs-dra", "gs-dra"
    k8skit.install_chart(cluster.admin_kubeconfig, release, namespace, {"mode": "dra"}, workdir)
    objects = _ours(admin, release)
    assert {"DeviceClass/gpu.gpuslice.io", "DeviceClass/gpu-share.gpuslice.io", "DeviceClass/mig.gpuslice.io"} <= set(
        objects
    ), objects
    assert "ValidatingAdmissionPolicy/gs-dra-gpuslice-share-requests" in objects, objects
    assert "ValidatingAdmissionPolicy/gs-dra-gpuslice-node-labels" in objects, objects
    assert not any(name.startswith("DaemonSet/") and "device-plugin" in name for name in objects), objects
    policy = kubernetes.client.AdmissionregistrationV1Api(admin).read_validating_admission_policy(
        "gs-dra-gpuslice-node-labels"
    )
    assert not (policy.status and policy.status.type_checking and policy.status.type_checking.expression_warnings)
    webhooks = kubernetes.client.AdmissionregistrationV1Api(admin).read_mutating_webhook_configuration(
        f"{release}-gpuslice-webhook"
    )
    assert {w.name.split(".")[0]: w.side_effects for w in webhooks.webhooks}["pods"] == "NoneOnDryRun"
    k8skit.helm(cluster.admin_kubeconfig, "uninstall", release, "--namespace", namespace)
    k8skit.wait_for("uninstall to remove every object of the release", lambda: not _ours(admin, release), timeout=60)


def test_an_upgrade_keeps_the_chart_made_certificate_and_ca_bundle(
    cluster: controlplane.ControlPlane,
    admin: kubernetes.client.ApiClient,
    core: kubernetes.client.CoreV1Api,
    workdir: pathlib.Path,
) -> None:
    release, namespace = "gs-upgrade", "gs-upgrade"
    k8skit.install_chart(cluster.admin_kubeconfig, release, namespace, {}, workdir)
    secret_name = f"{release}-gpuslice-webhook-tls"
    before = core.read_namespaced_secret(secret_name, namespace).data
    webhooks = kubernetes.client.AdmissionregistrationV1Api(admin)
    mwc_name = f"{release}-gpuslice-webhook"
    bundle_before = webhooks.read_mutating_webhook_configuration(mwc_name).webhooks[0].client_config.ca_bundle

    k8skit.install_chart(
        cluster.admin_kubeconfig, release, namespace, {"webhook": {"timeoutSeconds": 7}}, workdir, upgrade=True
    )
    after = core.read_namespaced_secret(secret_name, namespace).data
    mwc = webhooks.read_mutating_webhook_configuration(mwc_name)
    assert mwc.webhooks[0].timeout_seconds == 7  # the upgrade did apply
    assert after == before
    assert mwc.webhooks[0].client_config.ca_bundle == bundle_before == before["ca.crt"]
    k8skit.helm(cluster.admin_kubeconfig, "uninstall", release, "--namespace", namespace)


def test_helm_install_without_an_image_stops_with_the_chart_s_message_and_creates_nothing(
    cluster: controlplane.ControlPlane, admin: kubernetes.client.ApiClient, workdir: pathlib.Path
) -> None:
    release, namespace = "gs-no-image", "gs-no-image"
    args = ["install", release, str(chartkit.CHART), "--namespace", namespace, "--create-namespace"]
    result = k8skit.helm(cluster.admin_kubeconfig, *args, check=False)  # the chart's own values: no image
    assert result.returncode != 0
    message = " ".join(result.stderr.split())
    assert "image.repository is not set: gpuslice publishes no image" in message
    assert (
        "make image IMAGE=<registry>/gpuslice:" in message and "--set image.repository=<registry>/gpuslice" in message
    )
    assert _ours(admin, release) == []


def test_cert_manager_asked_for_where_it_is_not_installed_stops_helm_install_with_what_to_do(
    cluster: controlplane.ControlPlane, admin: kubernetes.client.ApiClient, workdir: pathlib.Path
) -> None:
    """Instead of helm's raw "no matches for kind Issuer" after it has begun to apply."""
    groups = kubernetes.client.ApisApi(admin).get_api_versions().groups
    if any(group.name == "cert-manager.io" for group in groups):
        pytest.skip("an earlier test installed cert-manager's CRDs in this session's cluster")
    release, namespace = "gs-no-cert-manager", "gs-no-cert-manager"
    values = {"webhook": {"tls": {"source": "certManager"}}}
    with pytest.raises(AssertionError) as refused:
        k8skit.install_chart(cluster.admin_kubeconfig, release, namespace, values, workdir)
    message = " ".join(str(refused.value).split())
    assert "webhook.tls.source is certManager, but the cluster serves no cert-manager.io/v1 API" in message
    assert "install cert-manager first" in message and "no matches for kind" not in message
    assert _ours(admin, release) == []


@pytest.mark.usefixtures("cert_manager_crds")
def test_with_cert_manager_the_chart_asks_cert_manager_for_the_certificate(
    cluster: controlplane.ControlPlane,
    admin: kubernetes.client.ApiClient,
    core: kubernetes.client.CoreV1Api,
    workdir: pathlib.Path,
) -> None:
    release, namespace = "gs-certmanager", "gs-certmanager"
    values = {"webhook": {"tls": {"source": "certManager"}}}
    k8skit.install_chart(cluster.admin_kubeconfig, release, namespace, values, workdir)
    custom = kubernetes.client.CustomObjectsApi(admin)
    certificates = custom.list_namespaced_custom_object("cert-manager.io", "v1", namespace, "certificates")["items"]
    serving = [c for c in certificates if not c["spec"].get("isCA")]
    assert len(serving) == 1
    assert serving[0]["spec"]["secretName"] == f"{release}-gpuslice-webhook-tls"
    assert f"{release}-gpuslice-webhook.{namespace}.svc" in serving[0]["spec"]["dnsNames"]
    # No chart-made Secret: cert-manager writes it, and its CA injector fills the caBundle.
    secrets = [s.metadata.name for s in core.list_namespaced_secret(namespace).items]
    assert f"{release}-gpuslice-webhook-tls" not in secrets
    mwc = kubernetes.client.AdmissionregistrationV1Api(admin).read_mutating_webhook_configuration(
        f"{release}-gpuslice-webhook"
    )
    assert mwc.metadata.annotations["cert-manager.io/inject-ca-from"] == f"{namespace}/{release}-gpuslice-webhook-tls"
    k8skit.helm(cluster.admin_kubeconfig, "uninstall", release, "--namespace", namespace)
    k8skit.wait_for("uninstall", lambda: not _ours(admin, release) or None, timeout=60)


@pytest.mark.usefixtures("cert_manager_crds")
def test_by_default_the_chart_uses_cert_manager_where_the_cluster_serves_its_api(
    cluster: controlplane.ControlPlane,
    admin: kubernetes.client.ApiClient,
    core: kubernetes.client.CoreV1Api,
    workdir: pathlib.Path,
) -> None:
    """webhook.tls.source auto: helm reads the cluster's API groups, so a render without lookup (as
    Argo CD's) needs no chart-made CA wherever cert-manager is installed."""
    release, namespace = "gs-auto-tls", "gs-auto-tls"
    k8skit.install_chart(cluster.admin_kubeconfig, release, namespace, {}, workdir)
    custom = kubernetes.client.CustomObjectsApi(admin)
    certificates = custom.list_namespaced_custom_object("cert-manager.io", "v1", namespace, "certificates")["items"]
    assert f"{release}-gpuslice-webhook-tls" in [c["spec"]["secretName"] for c in certificates]
    secrets = [s.metadata.name for s in core.list_namespaced_secret(namespace).items]
    assert f"{release}-gpuslice-webhook-tls" not in secrets
    k8skit.helm(cluster.admin_kubeconfig, "uninstall", release, "--namespace", namespace)
    k8skit.wait_for("uninstall", lambda: not _ours(admin, release) or None, timeout=60)
