"""The chart's pacer (config.pacing.enabled; docs/steering.md, "Pacing"): nothing of it by default;
with pacing on one pacer that is never two (Recreate), allowed only to watch pods and nodes,
patch pods and renew its Lease (which the webhook may read), reading the shared configuration;
pacing in DRA mode is refused with a message."""

from __future__ import annotations

import pathlib
from typing import Any

import chartkit
import pytest

from gpuslice import config, contract
from gpuslice.pacer import main as pacer_main

pytestmark = pytest.mark.helm

PACING: dict[str, Any] = {"config": {"pacing": {"enabled": True}}}


def pacer_objects(manifests: chartkit.Manifests) -> list[dict[str, Any]]:
    return [o for o in manifests if o["metadata"]["labels"]["app.kubernetes.io/component"] == "pacer"]


def shared_config(manifests: chartkit.Manifests, tmp_path: pathlib.Path) -> config.Config:
    path = tmp_path / "config.yaml"
    path.write_text(manifests.one("ConfigMap", "config")["data"]["config.yaml"])
    return config.load(path, environ={})


def test_nothing_of_the_pacer_is_rendered_unless_pacing_is_on(tmp_path):
    manifests = chartkit.render({"serviceMonitor": {"enabled": True}})
    assert pacer_objects(manifests) == []
    assert not [o for o in manifests if "pacer" in o["metadata"]["name"]]
    assert shared_config(manifests, tmp_path).pacing.enabled is False
    assert "pacing" not in chartkit.render_notes({}, tmp_path).lower()


def test_with_pacing_on_one_pacer_runs_and_a_rollout_never_runs_two():
    manifests = chartkit.render(PACING)
    deployment = manifests.one("Deployment", "pacer")
    assert deployment["spec"]["replicas"] == 1
    # Each pacer counts only its own releases in flight: two at once would each release a pod.
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pacer = chartkit.container(deployment)
    webhook = chartkit.container(manifests.one("Deployment", "webhook"))
    assert pacer["command"] == ["gpuslice-pacer"]
    assert pacer["image"] == webhook["image"] and pacer["imagePullPolicy"] == webhook["imagePullPolicy"]
    (port,) = pacer["ports"]
    assert port["name"] == "http" and str(port["containerPort"]) == chartkit.arg_value(pacer, "--port")
    assert pacer["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert pacer["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    for obj in manifests:
        assert chartkit.schema_errors(obj, chartkit.KUBE_VERSIONS[-1]) == [], obj["metadata"]["name"]


def test_the_pacer_reads_the_shared_configuration_and_rolls_when_it_changes(tmp_path):
    manifests = chartkit.render(chartkit.merged(PACING, {"config": {"pacing": {"maxInFlight": 2}}}))
    deployment = manifests.one("Deployment", "pacer")
    pacer = chartkit.container(deployment)
    path = chartkit.arg_value(pacer, "--config")
    directory, filename = path.rsplit("/", 1)
    assert path == "/etc/gpuslice/config.yaml"
    mount = chartkit.mount_for(pacer, directory)
    assert mount and mount["readOnly"] is True
    source = chartkit.volume(deployment, mount["name"])["configMap"]
    assert source["name"] == manifests.one("ConfigMap", "config")["metadata"]["name"]
    assert {"key": "config.yaml", "path": filename} in source["items"]

    settings = shared_config(manifests, tmp_path)
    assert settings.pacing == config.PacingConfig(enabled=True, max_in_flight=2)
    # The pacer's own command line accepts what the chart gives it and reads the same settings.
    local = [f"--config={tmp_path / 'config.yaml'}" if a.startswith("--config=") else a for a in pacer["args"]]
    args = pacer_main.build_parser().parse_args(local)
    assert config.from_args(args, environ={}) == settings
    assert args.port == pacer["ports"][0]["containerPort"]

    def checksum(values: dict[str, Any], component: str = "pacer") -> str:
        template = chartkit.render(values).one("Deployment", component)["spec"]["template"]
        return template["metadata"]["annotations"]["checksum/config"]

    assert checksum(PACING) != checksum(chartkit.merged(PACING, {"config": {"pacing": {"maxInFlight": 2}}}))
    assert checksum(PACING) == checksum(PACING, "webhook")  # the same file, so the same sum


def test_the_pacer_may_only_watch_pods_and_nodes_and_patch_pods():
    manifests = chartkit.render(PACING)
    assert manifests.one("ClusterRole", "pacer")["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]},
    ]
    binding = manifests.one("ClusterRoleBinding", "pacer")
    assert binding["roleRef"]["name"] == manifests.one("ClusterRole", "pacer")["metadata"]["name"]
    (subject,) = binding["subjects"]
    service_account = manifests.one("ServiceAccount", "pacer")["metadata"]
    assert (subject["name"], subject["namespace"]) == (service_account["name"], service_account["namespace"])
    assert chartkit.pod_spec(manifests.one("Deployment", "pacer"))["serviceAccountName"] == subject["name"]
    # Pacing adds nothing to the webhook's cluster-wide rights (only the Lease below).
    assert manifests.one("ClusterRole", "webhook") == chartkit.render({}).one("ClusterRole", "webhook")


@pytest.mark.parametrize(
    ("pacing", "name", "namespace"),
    [({}, "gpuslice-pacer", "gpuslice"), ({"leaseName": "beat", "leaseNamespace": "ops"}, "beat", "ops")],
    ids=["defaults", "own-name-and-namespace"],
)
def test_the_pacer_may_renew_its_lease_and_the_webhook_only_read_it(pacing, name, namespace):
    manifests = chartkit.render(chartkit.merged(PACING, {"config": {"pacing": pacing}}))
    lease = {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"]}
    roles = lease_roles(manifests)
    # create cannot be limited by name: the name of an object being created is not known to RBAC.
    assert roles["pacer"]["rules"] == [
        {**lease, "resourceNames": [name], "verbs": ["get", "update"]},
        {**lease, "verbs": ["create"]},
    ]
    assert roles["webhook"]["rules"] == [{**lease, "resourceNames": [name], "verbs": ["get"]}]
    for component in ("pacer", "webhook"):
        role = roles[component]
        (binding,) = [
            b for b in manifests.all("RoleBinding", component) if b["roleRef"]["name"] == role["metadata"]["name"]
        ]
        account = manifests.one("ServiceAccount", component)["metadata"]
        assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == namespace
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
        ]
        assert chartkit.schema_errors(role, chartkit.KUBE_VERSIONS[-1]) == []
        # Both read the Lease's namespace, when the configuration leaves it empty, from the downward API.
        env = chartkit.container(manifests.one("Deployment", component))["env"]
        assert {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in env
    assert chartkit.render({}).all("Role", "pacer") == []


def lease_roles(manifests: chartkit.Manifests) -> dict[str, dict[str, Any]]:
    """Each component's Role on Leases (the webhook has another Role, for its requeue journal)."""
    return {
        o["metadata"]["labels"]["app.kubernetes.io/component"]: o
        for o in manifests.all("Role")
        if any("leases" in r.get("resources", ()) for r in o["rules"])
    }


def lease_names(manifests: chartkit.Manifests, tmp_path: pathlib.Path) -> dict[str, Any]:
    """The Lease name each part of one render uses: the shared configuration and each Role."""
    roles = lease_roles(manifests)
    return {
        "config": shared_config(manifests, tmp_path).pacing.lease_name,
        **{f"{c} role": sorted({n for r in roles[c]["rules"] for n in r.get("resourceNames", ())}) for c in roles},
    }


def test_two_releases_in_one_namespace_renew_different_leases(tmp_path):
    """One Lease for two releases would let either's pacer keep the other's webhook gating pods."""
    for release in ("team-a", "team-b"):
        manifests = chartkit.render(PACING, release=release)
        name = f"{release}-gpuslice-pacer"
        assert lease_names(manifests, tmp_path) == {"config": name, "pacer role": [name], "webhook role": [name]}
        assert name == manifests.one("Deployment", "pacer")["metadata"]["name"]  # the pacer's own name


def test_an_explicit_lease_name_is_used_as_given(tmp_path):
    values = chartkit.merged(PACING, {"config": {"pacing": {"leaseName": "beat"}}})
    for release in ("team-a", "team-b"):
        manifests = chartkit.render(values, release=release)
        assert lease_names(manifests, tmp_path) == {"config": "beat", "pacer role": ["beat"], "webhook role": ["beat"]}
    assert "renews its Lease beat: with the pacer down" in " ".join(chartkit.render_notes(values, tmp_path).split())


def test_the_pacer_runs_locked_down_and_takes_its_placement_from_its_values():
    placement = {
        "nodeSelector": {"node-pool": "system"},
        "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
        "priorityClassName": "system-cluster-critical",
        "podSecurityContext": {"runAsUser": 1000},
    }
    spec = chartkit.pod_spec(chartkit.render(chartkit.merged(PACING, {"pacer": placement})).one("Deployment", "pacer"))
    assert spec["nodeSelector"] == placement["nodeSelector"] and spec["tolerations"] == placement["tolerations"]
    assert spec["priorityClassName"] == "system-cluster-critical"
    assert spec["securityContext"]["runAsUser"] == 1000 and spec["securityContext"]["runAsNonRoot"] is True
    defaults = chartkit.pod_spec(chartkit.render(PACING).one("Deployment", "pacer"))
    assert "priorityClassName" not in defaults and "nodeSelector" not in defaults
    assert defaults["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert defaults["securityContext"]["runAsNonRoot"] is True and defaults["securityContext"]["runAsUser"] != 0
    (pacer,) = defaults["containers"]
    context = pacer["securityContext"]
    assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert pacer["resources"]["requests"]["cpu"] and pacer["resources"]["limits"]["memory"]
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        assert not defaults.get(flag), flag


def test_prometheus_scrapes_the_pacer_only_where_it_runs():
    manifests = chartkit.render(chartkit.merged(PACING, {"serviceMonitor": {"enabled": True}}))
    monitor = manifests.one("ServiceMonitor", "pacer")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["path"], endpoint["scheme"]) == ("/metrics", "http")
    service = manifests.one("Service", "pacer")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    pod_labels = manifests.one("Deployment", "pacer")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert port["name"] == endpoint["port"] and port["targetPort"] == "http"
    assert chartkit.schema_errors(service, chartkit.KUBE_VERSIONS[-1]) == []
    assert chartkit.render(PACING).all("ServiceMonitor") == []


def test_the_notes_say_gated_pods_wait_for_the_pacer(tmp_path):
    notes = " ".join(chartkit.render_notes(PACING, tmp_path).split())
    deployment = chartkit.render(PACING).one("Deployment", "pacer")["metadata"]["name"]
    assert contract.Contract().pacing_gate in notes
    assert f"until the pacer, Deployment {deployment}, releases them" in notes
    assert "renews its Lease gpuslice-pacer: with the pacer down, new pods go ungated" in notes


@pytest.mark.parametrize(
    ("values", "why"),
    [
        ({"mode": "dra"}, "mode dra"),
        ({"mode": "both", "config": {"dra": {"enabled": True}}}, "config.dra.enabled"),
        ({"config": {"dra": {"enabled": True}}}, "config.dra.enabled"),
    ],
    ids=["mode-dra", "mode-both-serving-claims", "dra-enabled"],
)
def test_pacing_is_refused_where_the_webhook_makes_resource_claims(values, why, tmp_path):
    """DRA allocation cannot over-commit a node by lagging labels, and the webhook gates no claim pods."""
    args = chartkit.template_args(chartkit.merged(PACING, values), tmp_path, "--kube-version", "1.36.0")
    result = chartkit.run_helm(*args)
    assert result.returncode != 0
    refusal = f"config.pacing.enabled needs the webhook in device-plugin mode, but it makes ResourceClaims here ({why})"
    assert refusal in result.stderr
    assert "set config.pacing.enabled=false" in result.stderr


def test_in_mode_both_the_pacer_runs_while_the_webhook_serves_the_device_plugin_half():
    assert chartkit.render(chartkit.merged(PACING, {"mode": "both"}), "1.36.0").one("Deployment", "pacer")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"config": {"pacing": {"maxInFlight": "x"}}}, "maxInFlight"),
        ({"config": {"pacing": {"maxInFlight": 0}}}, "maxInFlight"),
        ({"config": {"pacing": {"bindTimeoutSeconds": 0}}}, "bindTimeoutSeconds"),
        ({"config": {"pacing": {"lagTimeoutSeconds": "soon"}}}, "lagTimeoutSeconds"),
        ({"config": {"pacing": {"enabled": "yes"}}}, "enabled"),
        ({"config": {"pacing": {"maxInflight": 2}}}, "maxInflight"),
        ({"config": {"pacing": {"leaseName": "Pacer_Lease"}}}, "leaseName"),
        ({"config": {"pacing": {"leaseSeconds": 0}}}, "leaseSeconds"),
        ({"config": {"pacing": {"leaseNamespace": "a.b"}}}, "leaseNamespace"),
        ({"pacer": {"replicas": 2}}, "replicas"),
        ({"pacer": {"httpPort": 80}}, "httpPort"),
        ({"pacer": {"resources": []}}, "resources"),
    ],
    ids=[
        "in-flight-not-a-number",
        "no-pod-in-flight",
        "zero-timeout",
        "lag-timeout-not-a-number",
        "enabled-not-boolean",
        "misspelt-key",
        "lease-name-not-an-object-name",
        "lease-that-never-holds",
        "lease-namespace-not-a-namespace",
        "replicas-are-not-a-value",
        "privileged-port",
        "resources-not-a-map",
    ],
)
def test_the_values_schema_refuses_bad_pacing_values(values, message, tmp_path):
    result = chartkit.run_helm(*chartkit.template_args(values, tmp_path))
    assert result.returncode != 0
    assert message in result.stderr
