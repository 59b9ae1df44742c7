"""The chart's controller (controller/): by default two replicas that elect a leader, to requeue
refused pods; with config.pacing.enabled they pace too. Allowed only what each job needs (watch
Failed pods, delete and create pods, Events, its journal's ConfigMaps; with pacing, watch pods and
nodes and patch pods), to take and renew its Lease (which the webhook may read with pacing on),
reading the shared configuration; nothing of it in DRA mode or with both jobs off; pacing in DRA
mode is refused with a message."""

from __future__ import annotations

import pathlib
from typing import Any

import chartkit
import pytest

from gpuslice import config, contract
from gpuslice.controller import main as controller_main

pytestmark = pytest.mark.helm

PACING: dict[str, Any] = {"config": {"pacing": {"enabled": True}}}


def controller_objects(manifests: chartkit.Manifests) -> list[dict[str, Any]]:
    return [o for o in manifests if o["metadata"]["labels"]["app.kubernetes.io/component"] == "controller"]


def shared_config(manifests: chartkit.Manifests, tmp_path: pathlib.Path) -> config.Config:
    path = tmp_path / "config.yaml"
    path.write_text(manifests.one("ConfigMap", "config")["data"]["config.yaml"])
    return config.load(path, environ={})


NO_JOBS: dict[str, Any] = {"config": {"requeue": {"enabled": False}}}


@pytest.mark.parametrize(
    ("values", "kube_version"),
    [(NO_JOBS, chartkit.KUBE_VERSIONS[-1]), ({"mode": "dra"}, "1.36.0")],
    ids=["requeue-and-pacing-off", "mode-dra"],
)
def test_nothing_of_the_controller_is_rendered_when_it_has_nothing_to_do(values, kube_version, tmp_path):
    manifests = chartkit.render(chartkit.merged(values, {"serviceMonitor": {"enabled": True}}), kube_version)
    assert controller_objects(manifests) == []
    assert not [o for o in manifests if "controller" in o["metadata"]["name"]]
    assert "pacing" not in chartkit.render_notes(values, tmp_path, kube_version).lower()


def test_by_default_two_replicas_elect_a_leader_and_a_rollout_may_overlap(tmp_path):
    manifests = chartkit.render({})
    assert shared_config(manifests, tmp_path).pacing.enabled is False
    assert "pacing" not in chartkit.render_notes({}, tmp_path).lower()
    deployment = manifests.one("Deployment", "controller")
    assert deployment["spec"]["replicas"] == 2
    # One leader acts whatever the number of pods: old and new may overlap in a rollout.
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    env = chartkit.container(deployment)["env"]
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in env
    for obj in manifests:
        assert chartkit.schema_errors(obj, chartkit.KUBE_VERSIONS[-1]) == [], obj["metadata"]["name"]


def test_with_pacing_on_the_controller_runs_the_image_s_controller_command():
    manifests = chartkit.render(PACING)
    deployment = manifests.one("Deployment", "controller")
    controller = chartkit.container(deployment)
    webhook = chartkit.container(manifests.one("Deployment", "webhook"))
    assert controller["command"] == ["gpuslice-controller"]
    assert controller["image"] == webhook["image"] and controller["imagePullPolicy"] == webhook["imagePullPolicy"]
    (port,) = controller["ports"]
    assert port["name"] == "http" and str(port["containerPort"]) == chartkit.arg_value(controller, "--port")
    assert controller["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert controller["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    for obj in manifests:
        assert chartkit.schema_errors(obj, chartkit.KUBE_VERSIONS[-1]) == [], obj["metadata"]["name"]


def test_the_controller_reads_the_shared_configuration_and_rolls_when_it_changes(tmp_path):
    manifests = chartkit.render(chartkit.merged(PACING, {"config": {"pacing": {"maxInFlight": 2}}}))
    deployment = manifests.one("Deployment", "controller")
    controller = chartkit.container(deployment)
    path = chartkit.arg_value(controller, "--config")
    directory, filename = path.rsplit("/", 1)
    assert path == "/etc/gpuslice/config.yaml"
    mount = chartkit.mount_for(controller, directory)
    assert mount and mount["readOnly"] is True
    source = chartkit.volume(deployment, mount["name"])["configMap"]
    assert source["name"] == manifests.one("ConfigMap", "config")["metadata"]["name"]
    assert {"key": "config.yaml", "path": filename} in source["items"]

    settings = shared_config(manifests, tmp_path)
    assert settings.pacing == config.PacingConfig(enabled=True, max_in_flight=2)
    # The controller's own command line accepts what the chart gives it and reads the same settings.
    local = [f"--config={tmp_path / 'config.yaml'}" if a.startswith("--config=") else a for a in controller["args"]]
    args = controller_main.build_parser().parse_args(local)
    assert config.from_args(args, environ={}) == settings
    assert args.port == controller["ports"][0]["containerPort"]

    def checksum(values: dict[str, Any], component: str = "controller") -> str:
        template = chartkit.render(values).one("Deployment", component)["spec"]["template"]
        return template["metadata"]["annotations"]["checksum/config"]

    assert checksum(PACING) != checksum(chartkit.merged(PACING, {"config": {"pacing": {"maxInFlight": 2}}}))
    assert checksum(PACING) == checksum(PACING, "webhook")  # the same file, so the same sum


@pytest.mark.parametrize(
    ("values", "rules"),
    [
        (
            PACING,
            [
                {
                    "apiGroups": [""],
                    "resources": ["pods"],
                    "verbs": ["get", "list", "watch", "patch", "create", "delete"],
                },
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]},
            ],
        ),
        (
            chartkit.merged(PACING, NO_JOBS),
            [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]},
            ],
        ),
    ],
    ids=["requeue-and-pacing", "pacing-alone"],
)
def test_the_controller_may_only_do_what_its_jobs_need(values, rules):
    manifests = chartkit.render(values)
    assert manifests.one("ClusterRole", "controller")["rules"] == rules
    binding = manifests.one("ClusterRoleBinding", "controller")
    assert binding["roleRef"]["name"] == manifests.one("ClusterRole", "controller")["metadata"]["name"]
    (subject,) = binding["subjects"]
    service_account = manifests.one("ServiceAccount", "controller")["metadata"]
    assert (subject["name"], subject["namespace"]) == (service_account["name"], service_account["namespace"])
    assert chartkit.pod_spec(manifests.one("Deployment", "controller"))["serviceAccountName"] == subject["name"]
    # Pacing adds nothing to the webhook's cluster-wide rights (only the Lease below).
    assert manifests.one("ClusterRole", "webhook") == chartkit.render({}).one("ClusterRole", "webhook")


@pytest.mark.parametrize(
    ("pacing", "name", "namespace"),
    [({}, "gpuslice-controller", "gpuslice"), ({"leaseName": "beat", "leaseNamespace": "ops"}, "beat", "ops")],
    ids=["defaults", "own-name-and-namespace"],
)
def test_the_controller_may_take_and_renew_its_lease_and_the_webhook_only_read_it(pacing, name, namespace):
    manifests = chartkit.render(chartkit.merged(PACING, {"config": {"controller": pacing}}))
    lease = {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"]}
    roles = lease_roles(manifests)
    # create cannot be limited by name: the name of an object being created is not known to RBAC.
    assert roles["controller"]["rules"] == [
        {**lease, "resourceNames": [name], "verbs": ["get", "update"]},
        {**lease, "verbs": ["create"]},
    ]
    assert roles["webhook"]["rules"] == [{**lease, "resourceNames": [name], "verbs": ["get"]}]
    for component in ("controller", "webhook"):
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
    # Without pacing the webhook reads no Lease; the controller still elects its leader.
    assert set(lease_roles(chartkit.render({}))) == {"controller"}


def lease_roles(manifests: chartkit.Manifests) -> dict[str, dict[str, Any]]:
    """Each component's Role on Leases (the controller has another Role, for its requeue journal)."""
    return {
        o["metadata"]["labels"]["app.kubernetes.io/component"]: o
        for o in manifests.all("Role")
        if any("leases" in r.get("resources", ()) for r in o["rules"])
    }


def lease_names(manifests: chartkit.Manifests, tmp_path: pathlib.Path) -> dict[str, Any]:
    """The Lease name each part of one render uses: the shared configuration and each Role."""
    roles = lease_roles(manifests)
    return {
        "config": shared_config(manifests, tmp_path).controller.lease_name,
        **{f"{c} role": sorted({n for r in roles[c]["rules"] for n in r.get("resourceNames", ())}) for c in roles},
    }


def test_two_releases_in_one_namespace_elect_on_different_leases(tmp_path):
    """One Lease for two releases would let one's leader keep the other's standing by, and its webhook gating."""
    for release in ("team-a", "team-b"):
        manifests = chartkit.render(PACING, release=release)
        name = f"{release}-gpuslice-controller"
        assert lease_names(manifests, tmp_path) == {"config": name, "controller role": [name], "webhook role": [name]}
        assert name == manifests.one("Deployment", "controller")["metadata"]["name"]  # the Deployment's own name


def test_an_explicit_lease_name_is_used_as_given(tmp_path):
    values = chartkit.merged(PACING, {"config": {"controller": {"leaseName": "beat"}}})
    for release in ("team-a", "team-b"):
        manifests = chartkit.render(values, release=release)
        assert lease_names(manifests, tmp_path) == {
            "config": "beat",
            "controller role": ["beat"],
            "webhook role": ["beat"],
        }
    assert "renews the Lease beat: with the controller down" in " ".join(
        chartkit.render_notes(values, tmp_path).split()
    )


def test_the_controller_runs_locked_down_and_takes_its_placement_from_its_values():
    placement = {
        "nodeSelector": {"node-pool": "system"},
        "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
        "priorityClassName": "system-cluster-critical",
        "podSecurityContext": {"runAsUser": 1000},
    }
    manifests = chartkit.render(chartkit.merged(PACING, {"controller": placement}))
    spec = chartkit.pod_spec(manifests.one("Deployment", "controller"))
    assert spec["nodeSelector"] == placement["nodeSelector"] and spec["tolerations"] == placement["tolerations"]
    assert spec["priorityClassName"] == "system-cluster-critical"
    assert spec["securityContext"]["runAsUser"] == 1000 and spec["securityContext"]["runAsNonRoot"] is True
    defaults = chartkit.pod_spec(chartkit.render(PACING).one("Deployment", "controller"))
    assert "priorityClassName" not in defaults and "nodeSelector" not in defaults
    assert defaults["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert defaults["securityContext"]["runAsNonRoot"] is True and defaults["securityContext"]["runAsUser"] != 0
    (container,) = defaults["containers"]
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        assert not defaults.get(flag), flag


def test_prometheus_scrapes_the_controller_only_where_it_runs():
    manifests = chartkit.render(chartkit.merged(PACING, {"serviceMonitor": {"enabled": True}}))
    monitor = manifests.one("ServiceMonitor", "controller")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["path"], endpoint["scheme"]) == ("/metrics", "http")
    service = manifests.one("Service", "controller")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    pod_labels = manifests.one("Deployment", "controller")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert port["name"] == endpoint["port"] and port["targetPort"] == "http"
    assert chartkit.schema_errors(service, chartkit.KUBE_VERSIONS[-1]) == []
    assert chartkit.render(PACING).all("ServiceMonitor") == []


def test_the_notes_say_gated_pods_wait_for_the_controller(tmp_path):
    notes = " ".join(chartkit.render_notes(PACING, tmp_path).split())
    deployment = chartkit.render(PACING).one("Deployment", "controller")["metadata"]["name"]
    assert contract.Contract().pacing_gate in notes
    assert f"until the leader of the controller, Deployment {deployment}, releases them" in notes
    assert "renews the Lease gpuslice-controller: with the controller down, new pods go ungated" in notes


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


def test_in_mode_both_the_controller_runs_while_the_webhook_serves_the_device_plugin_half():
    assert chartkit.render(chartkit.merged(PACING, {"mode": "both"}), "1.36.0").one("Deployment", "controller")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"config": {"pacing": {"maxInFlight": "x"}}}, "maxInFlight"),
        ({"config": {"pacing": {"maxInFlight": 0}}}, "maxInFlight"),
        ({"config": {"pacing": {"bindTimeoutSeconds": 0}}}, "bindTimeoutSeconds"),
        ({"config": {"pacing": {"lagTimeoutSeconds": "soon"}}}, "lagTimeoutSeconds"),
        ({"config": {"pacing": {"enabled": "yes"}}}, "enabled"),
        ({"config": {"pacing": {"maxInflight": 2}}}, "maxInflight"),
        ({"config": {"controller": {"leaseName": "Controller_Lease"}}}, "leaseName"),
        ({"config": {"controller": {"leaseSeconds": 0}}}, "leaseSeconds"),
        ({"config": {"controller": {"leaseNamespace": "a.b"}}}, "leaseNamespace"),
        ({"config": {"pacing": {"leaseName": "moved"}}}, "leaseName"),
        ({"controller": {"replicas": 0}}, "replicas"),
        ({"controller": {"httpPort": 80}}, "httpPort"),
        ({"controller": {"resources": []}}, "resources"),
        ({"pacer": {"httpPort": 8080}}, "pacer"),
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
        "lease-keys-moved-to-config-controller",
        "no-replica",
        "privileged-port",
        "resources-not-a-map",
        "values-of-the-pacer-before-it-was-the-controller",
    ],
)
def test_the_values_schema_refuses_bad_controller_values(values, message, tmp_path):
    result = chartkit.run_helm(*chartkit.template_args(values, tmp_path))
    assert result.returncode != 0
    assert message in result.stderr
