"""The chart against an API server: its generated TLS stays the same across `helm upgrade`, and it
adapts to the cluster's version.

helm renders with `install --dry-run=server`, which is what install and upgrade do before applying: it
asks the API server for its version and resources (discovery) and answers the chart's `lookup` calls. The
API server here is a small aiohttp app that answers exactly those reads, as kube-apiserver does.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import dataclasses
import json
import os
import pathlib
from typing import Any

import chartkit
import pytest
from aiohttp import web

pytestmark = pytest.mark.helm

# Discovery of the kinds the chart creates: group -> (version, [(resource, kind, namespaced)]).
RESOURCES: dict[str, tuple[str, list[tuple[str, str, bool]]]] = {
    "": (
        "v1",
        [
            ("configmaps", "ConfigMap", True),
            ("secrets", "Secret", True),
            ("services", "Service", True),
            ("serviceaccounts", "ServiceAccount", True),
            ("namespaces", "Namespace", False),
        ],
    ),
    "apps": ("v1", [("deployments", "Deployment", True), ("daemonsets", "DaemonSet", True)]),
    "policy": ("v1", [("poddisruptionbudgets", "PodDisruptionBudget", True)]),
    "rbac.authorization.k8s.io": (
        "v1",
        [
            ("clusterroles", "ClusterRole", False),
            ("clusterrolebindings", "ClusterRoleBinding", False),
            ("roles", "Role", True),
            ("rolebindings", "RoleBinding", True),
        ],
    ),
    "admissionregistration.k8s.io": (
        "v1",
        [
            ("mutatingwebhookconfigurations", "MutatingWebhookConfiguration", False),
            ("validatingadmissionpolicies", "ValidatingAdmissionPolicy", False),
            ("validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding", False),
        ],
    ),
}


@dataclasses.dataclass
class FakeApiServer:
    """The reads helm makes: /version, discovery, and GET of single namespaced objects."""

    git_version: str = "v1.31.2"
    objects: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # path -> object
    requests: list[str] = dataclasses.field(default_factory=list)
    # API groups served besides RESOURCES (e.g. cert-manager's), in RESOURCES' shape.
    extra_groups: dict[str, tuple[str, list[tuple[str, str, bool]]]] = dataclasses.field(default_factory=dict)

    def store(self, obj: dict[str, Any]) -> None:
        """Keep `obj` as helm would have left it: with the release's ownership metadata."""
        obj = copy.deepcopy(obj)
        obj["metadata"].setdefault("annotations", {}).update(
            {"meta.helm.sh/release-name": chartkit.RELEASE, "meta.helm.sh/release-namespace": chartkit.NAMESPACE}
        )
        (resource,) = [r for r, kind, _ in RESOURCES[""][1] if kind == obj["kind"]]
        self.objects[f"/api/v1/namespaces/{obj['metadata']['namespace']}/{resource}/{obj['metadata']['name']}"] = obj

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append(f"{request.method} {request.path}")
        path = request.path
        served = {**RESOURCES, **self.extra_groups}
        if path == "/version":
            major, minor = self.git_version.lstrip("v").split(".")[:2]
            return web.json_response({"major": major, "minor": minor, "gitVersion": self.git_version})
        if path == "/api":
            return web.json_response({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
        if path == "/apis":
            groups = [
                {
                    "name": group,
                    "versions": [{"groupVersion": f"{group}/{version}", "version": version}],
                    "preferredVersion": {"groupVersion": f"{group}/{version}", "version": version},
                }
                for group, (version, _) in served.items()
                if group
            ]
            return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        for group, (version, resources) in served.items():
            group_version = f"{group}/{version}" if group else version
            if path == ("/api/v1" if not group else f"/apis/{group_version}"):
                return web.json_response(
                    {
                        "kind": "APIResourceList",
                        "apiVersion": "v1",
                        "groupVersion": group_version,
                        "resources": [
                            {
                                "name": name,
                                "singularName": "",
                                "namespaced": namespaced,
                                "kind": kind,
                                "verbs": ["get", "list", "create", "update", "patch", "delete"],
                            }
                            for name, kind, namespaced in resources
                        ],
                    }
                )
        if request.method == "GET" and path in self.objects:
            return web.json_response(self.objects[path])
        return web.json_response(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": "NotFound",
                "code": 404,
                "details": {},
            },
            status=404,
        )


@pytest.fixture
async def api_server(tmp_path: pathlib.Path):
    """A running FakeApiServer and a kubeconfig file that points helm at it."""
    chartkit.require_helm()
    server = FakeApiServer()
    app = web.Application()
    app.router.add_route("*", "/{path:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                    "users": [{"name": "test", "user": {"token": "test"}}],
                    "contexts": [
                        {
                            "name": "fake",
                            "context": {"cluster": "fake", "user": "test", "namespace": chartkit.NAMESPACE},
                        }
                    ],
                    "current-context": "fake",
                }
            )
        )
        yield server, kubeconfig
    finally:
        await runner.cleanup()


def install_args(values: dict[str, Any] | None, tmp_path: pathlib.Path, *, test_image: bool = True) -> list[str]:
    """`helm install --dry-run=server`: the render install and upgrade apply, with the cluster's
    version, API groups and lookups (helm 3's `template` would not ask the cluster for them)."""
    args = ["install", chartkit.RELEASE, str(chartkit.CHART), "--namespace", chartkit.NAMESPACE]
    args += ["-f", str(chartkit.values_file(values or {}, tmp_path, test_image=test_image))]
    return [*args, "--dry-run=server", "--disable-openapi-validation"]


async def render_against(kubeconfig: pathlib.Path, tmp_path: pathlib.Path, values: dict[str, Any] | None = None):
    """helm's pre-apply render of an install or upgrade, against the fake API server."""
    output = await helm_against(kubeconfig, tmp_path, install_args(values, tmp_path))
    return chartkit.parse(output.split("\nMANIFEST:\n", 1)[1].split("\nNOTES:\n", 1)[0])


async def notes_against(kubeconfig: pathlib.Path, tmp_path: pathlib.Path, values: dict[str, Any]) -> str:
    """The NOTES `helm install` prints for the fake API server's cluster."""
    return (await helm_against(kubeconfig, tmp_path, install_args(values, tmp_path))).split("\nNOTES:\n", 1)[1]


async def helm_against(kubeconfig: pathlib.Path, tmp_path: pathlib.Path, args: list[str], *, ok: bool = True) -> str:
    """helm's stdout (or, with ok=False, its stderr after it failed) talking to the fake API server."""
    home = tmp_path / "helm-home"
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "HELM_CACHE_HOME": str(home),
        "HELM_CONFIG_HOME": str(home),
        "HELM_DATA_HOME": str(home),
    }
    process = await asyncio.create_subprocess_exec(
        str(chartkit.require_helm()), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=120)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    if not ok:
        assert process.returncode != 0, stdout.decode()
        return stderr.decode()
    assert process.returncode == 0, stderr.decode()
    return stdout.decode()


def tls_of(manifests: chartkit.Manifests) -> tuple[dict[str, Any], str]:
    secret = manifests.one("Secret", "webhook")
    hooks = manifests.one("MutatingWebhookConfiguration")["webhooks"]
    (bundle,) = {hook["clientConfig"]["caBundle"] for hook in hooks}  # every entry trusts the same CA
    return secret, bundle


async def test_generated_ca_and_certificate_survive_helm_upgrade(api_server, tmp_path):
    server, kubeconfig = api_server
    install = await render_against(kubeconfig, tmp_path)
    secret, ca_bundle = tls_of(install)
    assert base64.b64decode(secret["data"]["ca.crt"]) == base64.b64decode(ca_bundle)
    secret_path = f"/api/v1/namespaces/{chartkit.NAMESPACE}/secrets/{secret['metadata']['name']}"
    assert f"GET {secret_path}" in server.requests  # the chart looked for an existing Secret

    server.store(secret)  # what `helm install` left in the cluster
    upgrade = await render_against(kubeconfig, tmp_path, {"config": {"memoryUnitMiB": 512}})
    upgraded_secret, upgraded_bundle = tls_of(upgrade)
    assert upgraded_bundle == ca_bundle
    assert upgraded_secret["data"] == secret["data"]

    # Without the Secret in the cluster each render makes a new CA: the stability comes from lookup.
    server.objects.clear()
    fresh_secret, fresh_bundle = tls_of(await render_against(kubeconfig, tmp_path))
    assert fresh_bundle != ca_bundle and fresh_secret["data"]["tls.key"] != secret["data"]["tls.key"]


async def test_a_secret_missing_keys_is_replaced_not_half_reused(api_server, tmp_path):
    server, kubeconfig = api_server
    secret, ca_bundle = tls_of(await render_against(kubeconfig, tmp_path))
    broken = copy.deepcopy(secret)
    del broken["data"]["ca.crt"]
    server.store(broken)
    new_secret, new_bundle = tls_of(await render_against(kubeconfig, tmp_path))
    assert set(new_secret["data"]) == {"ca.crt", "tls.crt", "tls.key"}
    assert new_bundle == new_secret["data"]["ca.crt"] != ca_bundle


@pytest.mark.parametrize(
    ("git_version", "scheduler_tag", "node_policy"),
    [("v1.29.7", "v1.29.7", False), ("v1.31.2", "v1.31.2", True), ("v1.30.4-eks-a737599", "v1.30.4", True)],
)
async def test_chart_follows_the_cluster_version(api_server, tmp_path, git_version, scheduler_tag, node_policy):
    server, kubeconfig = api_server
    server.git_version = git_version
    values = {"scheduler": {"enabled": True}}
    if not node_policy:  # 1.29: the chart renders only when unconfined node writes are accepted
        values = chartkit.merged(values, chartkit.UNCONFINED_NODE_WRITES)
    manifests = await render_against(kubeconfig, tmp_path, values)
    scheduler = chartkit.container(manifests.one("Deployment", "scheduler"))
    assert scheduler["image"] == f"registry.k8s.io/kube-scheduler:{scheduler_tag}"
    assert ("ValidatingAdmissionPolicy" in manifests.kinds()) is node_policy


async def test_tls_source_auto_uses_cert_manager_when_the_cluster_serves_it(api_server, tmp_path):
    """helm (and Argo CD) pass the cluster's API groups to the render; where cert-manager's is
    there the default needs no lookup to stay the same between renders."""
    server, kubeconfig = api_server
    without = await render_against(kubeconfig, tmp_path)
    assert without.one("Secret", "webhook") and "Certificate" not in without.kinds()
    cert_manager = [("certificates", "Certificate", True), ("issuers", "Issuer", True)]
    server.extra_groups["cert-manager.io"] = ("v1", cert_manager)
    with_cert_manager = await render_against(kubeconfig, tmp_path)
    assert not with_cert_manager.all("Secret")
    assert {"Certificate", "Issuer"} <= with_cert_manager.kinds()
    configuration = with_cert_manager.one("MutatingWebhookConfiguration")
    assert "cert-manager.io/inject-ca-from" in configuration["metadata"]["annotations"]


async def test_install_asking_for_cert_manager_is_refused_until_the_cluster_serves_it(api_server, tmp_path):
    """The cluster's own API groups decide: helm install stops with what to do before it applies
    anything, instead of failing on "no matches for kind Issuer" half-way."""
    server, kubeconfig = api_server
    values = {"webhook": {"tls": {"source": "certManager"}}}
    refused = " ".join((await helm_against(kubeconfig, tmp_path, install_args(values, tmp_path), ok=False)).split())
    assert "webhook.tls.source is certManager, but the cluster serves no cert-manager.io/v1 API" in refused
    assert "install cert-manager first" in refused and "webhook.tls.source=generated" in refused
    server.extra_groups["cert-manager.io"] = (
        "v1",
        [("certificates", "Certificate", True), ("issuers", "Issuer", True)],
    )
    assert "Certificate" in (await render_against(kubeconfig, tmp_path, values)).kinds()


async def test_install_without_an_image_is_refused_with_how_to_build_one(api_server, tmp_path):
    _, kubeconfig = api_server
    refused = await helm_against(kubeconfig, tmp_path, install_args({}, tmp_path, test_image=False), ok=False)
    assert "image.repository is not set: gpuslice publishes no image" in " ".join(refused.split())


async def test_on_kubernetes_1_29_the_chart_refuses_unconfined_node_writes_or_warns_when_accepted(api_server, tmp_path):
    server, kubeconfig = api_server
    server.git_version = "v1.29.7"
    refused = await helm_against(kubeconfig, tmp_path, install_args({}, tmp_path), ok=False)
    assert "v1.29.7" in refused and "allowUnconfinedNodeWrites=true" in refused
    notes = await notes_against(kubeconfig, tmp_path, chartkit.UNCONFINED_NODE_WRITES)
    assert "WARNING: NODE WRITES ARE NOT CONFINED" in notes
    assert "Kubernetes v1.29.7 cannot run the node-write ValidatingAdmissionPolicy" in notes
    server.git_version = "v1.30.4"
    assert "NOT CONFINED" not in await notes_against(kubeconfig, tmp_path, {})
