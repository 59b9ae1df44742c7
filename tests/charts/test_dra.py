"""The chart's DRA mode: `mode` picks the device plugin, the DRA driver or both; DRA mode brings the
DeviceClasses, the DRA plugin DaemonSet and its RBAC, the webhook's right to create claim templates
and sideEffects NoneOnDryRun; clusters that cannot run consumable capacity are refused with a message."""

from __future__ import annotations

import re

import celpy
import chartkit
import pytest
import yaml

from gpuslice import config, contract
from gpuslice.dra import main as dra_main
from gpuslice.dra import slices
from gpuslice.node import nodefile

pytestmark = pytest.mark.helm

DRA = {"mode": "dra"}
BOTH = {"mode": "both"}


def config_of(manifests: chartkit.Manifests) -> config.Config:
    text = manifests.one("ConfigMap", "config")["data"]["config.yaml"]
    return config.load(overrides=dict(_flatten(yaml.safe_load(text))), environ={})


def _flatten(mapping, prefix=""):
    for key, value in mapping.items():
        if key == "version":
            continue
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield prefix + key, value


def side_effects(manifests: chartkit.Manifests) -> dict[str, str]:
    hooks = manifests.one("MutatingWebhookConfiguration")["webhooks"]
    return {hook["name"]: hook["sideEffects"] for hook in hooks}


def test_device_plugin_mode_renders_nothing_of_dra():
    manifests = chartkit.render({}, "1.37.0")
    assert "DeviceClass" not in manifests.kinds()
    assert manifests.all("DaemonSet", "dra-plugin") == []
    assert manifests.one("DaemonSet", "device-plugin")
    assert set(side_effects(manifests).values()) == {"None"}
    assert config_of(manifests).dra.enabled is False


@pytest.mark.parametrize("kube", ["1.36.0", "1.37.0"])
def test_dra_mode_renders_the_driver_instead_of_the_device_plugin(kube):
    manifests = chartkit.render(DRA, kube)
    assert manifests.all("DaemonSet", "device-plugin") == []
    assert manifests.all("ClusterRole", "device-plugin") == []
    classes = {c["metadata"]["name"]: c for c in manifests.all("DeviceClass")}
    assert sorted(classes) == ["gpu-share.gpuslice.io", "gpu.gpuslice.io", "mig.gpuslice.io"]
    for obj in manifests:
        try:
            assert chartkit.schema_errors(obj, kube) == [], obj["kind"]
        except chartkit.NoSchema:
            pass
    assert config_of(manifests).dra.enabled is True
    assert side_effects(manifests)["pods.gpuslice.io"] == "NoneOnDryRun"
    assert side_effects(manifests)["cpu-pods.gpuslice.io"] == "None"  # makes no claims (docs/webhook.md)
    rules = manifests.named("ClusterRole", "gpuslice-webhook-claims")["rules"]
    assert rules == [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaimtemplates"], "verbs": ["create"]}]


def test_the_dra_plugin_gets_what_kubelet_dra_needs():
    manifests = chartkit.render(DRA, "1.37.0")
    daemonset = manifests.one("DaemonSet", "dra-plugin")
    spec = chartkit.pod_spec(daemonset)
    assert spec["nodeSelector"] == {"gpuslice.io/enabled": "true"}
    container = chartkit.container(daemonset)
    assert container["command"] == ["gpuslice-dra-plugin"]
    for path in ("/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry", "/var/run/cdi", "/etc/gpuslice"):
        assert chartkit.mount_for(container, path) is not None, path
    assert chartkit.volume(daemonset, "kubelet-registry")["hostPath"]["path"] == "/var/lib/kubelet/plugins_registry"
    # The program accepts the command line the chart gives it.
    args = [
        a.replace("$(NODE_NAME)", "node-a").replace("/etc/gpuslice/config.yaml", "/dev/null") for a in container["args"]
    ]
    settings, options, _ = dra_main.parse_args(args)
    assert options.node_name == "node-a" and options.registry_dir == "/var/lib/kubelet/plugins_registry"
    assert options.cdi_dir == "/var/run/cdi" and options.http_port == 9401 and settings == config.Config()
    rules = manifests.named("ClusterRole", "gpuslice-dra-plugin")["rules"]
    assert {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]} in rules
    assert any("resourceslices" in r["resources"] and "create" in r["verbs"] and "delete" in r["verbs"] for r in rules)


@pytest.mark.parametrize("steering", [True, False])
def test_with_steering_the_dra_plugin_may_label_only_its_own_node_as_the_device_plugin(steering):
    manifests = chartkit.render({**DRA, "config": {"steering": {"enabled": steering}}}, "1.37.0")
    rules = manifests.named("ClusterRole", "gpuslice-dra-plugin")["rules"]
    nodes = next(r for r in rules if r["resources"] == ["nodes"])
    assert ("patch" in nodes["verbs"]) is steering
    assert any(r["resources"] == ["pods"] and r["verbs"] == ["list", "watch"] for r in rules) is steering
    policies = [p for p in manifests.all("ValidatingAdmissionPolicy") if p["metadata"]["name"].endswith("-node-labels")]
    if not steering:
        assert policies == []
        return
    (policy,) = policies
    (condition,) = policy["spec"]["matchConditions"]
    plugin_sa = manifests.one("ServiceAccount", "dra-plugin")["metadata"]["name"]
    username = f"system:serviceaccount:{chartkit.NAMESPACE}:{plugin_sa}"
    program = celpy.Environment().program(celpy.Environment().compile(condition["expression"]))
    request = celpy.json_to_cel({"userInfo": {"username": username}})
    assert program.evaluate({"request": request})
    assert not program.evaluate({"request": celpy.json_to_cel({"userInfo": {"username": "system:node:gpu-1"}})})


def test_both_modes_split_the_nodes_by_label_and_the_webhook_follows_config():
    manifests = chartkit.render(BOTH, "1.37.0")
    assert chartkit.pod_spec(manifests.one("DaemonSet", "dra-plugin"))["nodeSelector"] == {"gpuslice.io/dra": "true"}
    assert chartkit.pod_spec(manifests.one("DaemonSet", "device-plugin"))["nodeSelector"] == {
        "gpuslice.io/enabled": "true"
    }
    assert config_of(manifests).dra.enabled is False and side_effects(manifests)["pods.gpuslice.io"] == "None"
    claims = chartkit.render({**BOTH, "config": {"dra": {"enabled": True}}}, "1.37.0")
    assert config_of(claims).dra.enabled is True and side_effects(claims)["pods.gpuslice.io"] == "NoneOnDryRun"


@pytest.mark.parametrize(
    "values",
    [
        DRA,
        {**DRA, "devicePlugin": {"nodeSelection": "gpuFeatureLabels"}},
        BOTH,
        {**BOTH, "config": {"dra": {"enabled": True}}},
    ],
    ids=["dra", "dra-gpu-feature-labels", "both", "both-with-claims"],
)
def test_the_notes_of_dra_modes_give_the_dra_steps_with_the_labels_the_plugins_select(values, tmp_path):
    notes = " ".join(chartkit.render_notes(values, tmp_path, "1.37.0").split())
    manifests = chartkit.render(values, "1.37.0")
    # Every label a plugin DaemonSet selects its nodes by is one the notes tell the operator to set.
    for component in ("dra-plugin", "device-plugin"):
        for daemonset in manifests.all("DaemonSet", component):
            for key, value in chartkit.pod_spec(daemonset).get("nodeSelector", {}).items():
                assert re.search(rf"kubectl label node <[a-z-]+> {re.escape(key)}={value}\b", notes), (component, key)
    assert "kubectl get resourceslices --field-selector spec.driver=gpu.gpuslice.io" in notes
    assert f"DaemonSet {manifests.one('DaemonSet', 'dra-plugin')['metadata']['name']}" in notes
    claims = config_of(manifests).dra.enabled
    assert ("{.spec.resourceClaims}" in notes and "kubectl get resourceclaims" in notes) is claims
    assert ("{.spec.containers[0].resources.limits}" in notes) is not claims
    if values["mode"] == "dra":
        assert "there is no device plugin" in notes and "gpu-memory: <units>" not in notes
        assert "the device plugin runs only where" not in notes.lower()
    else:
        assert "(never both labels on one node)" in notes
        assert ("config.dra.enabled is false" in notes) is not claims
        assert ("config.dra.enabled is true" in notes) is claims


def test_device_plugin_mode_notes_say_nothing_of_dra(tmp_path):
    notes = chartkit.render_notes({}, tmp_path, "1.37.0")
    assert "resourceslices" not in notes and "DRA" not in notes and "resourceClaims" not in notes


@pytest.mark.parametrize(
    ("values", "kube", "message"),
    [
        (DRA, "1.33.0", "needs Kubernetes 1.34 or later"),
        (BOTH, "1.29.0", "needs Kubernetes 1.34 or later"),
        (DRA, "1.35.0", "needs the alpha feature gate DRAConsumableCapacity"),
        (BOTH, "1.34.0", "set dra.consumableCapacityGateEnabled=true"),
        ({"mode": "kubelet"}, "1.37.0", "mode"),
        (
            {**DRA, "config": {"resourcePrefix": "a-very-long-prefix-that-goes-on-and-on-and-on-and-on.example.com"}},
            "1.37.0",
            "63",
        ),
    ],
    ids=[
        "dra-on-1.33",
        "both-on-1.29",
        "dra-on-1.35-without-gate",
        "both-on-1.34-without-gate",
        "unknown-mode",
        "long-driver",
    ],
)
def test_dra_mode_is_refused_where_the_cluster_cannot_run_it(values, kube, message, tmp_path):
    result = chartkit.run_helm(*chartkit.template_args(values, tmp_path, "--kube-version", kube))
    assert result.returncode != 0
    assert message in result.stderr


def test_with_the_gate_declared_1_34_and_1_35_render_dra_mode():
    for kube in ("1.34.0", "1.35.0"):
        manifests = chartkit.render({**DRA, "dra": {"consumableCapacityGateEnabled": True}}, kube)
        assert len(manifests.all("DeviceClass")) == 3


def test_the_device_classes_select_exactly_the_plugins_devices(demo_node):
    manifests = chartkit.render(DRA, "1.37.0")
    devices = slices.devices(demo_node, contract.Contract())
    environment = celpy.Environment()

    def selected(device_class: dict) -> list[str]:
        program = environment.program(environment.compile(device_class["spec"]["selectors"][0]["cel"]["expression"]))
        names = []
        for device in devices:
            attributes = {k: next(iter(v.values())) for k, v in device["attributes"].items()}
            activation = {
                "device": celpy.json_to_cel(
                    {"driver": "gpu.gpuslice.io", "attributes": {"gpu.gpuslice.io": attributes}}
                )
            }
            if program.evaluate(activation):
                names.append(device["name"])
        return names

    assert selected(manifests.named("DeviceClass", "gpu.gpuslice.io")) == ["gpu-0", "gpu-1"]
    assert selected(manifests.named("DeviceClass", "mig.gpuslice.io")) == [f"gpu-2-mig-{i}" for i in range(4)]
    # The share class selects nothing itself: the shares' capacity, which the allocator skips a
    # device without, is on the shared GPUs alone (not on the MIG devices).
    assert manifests.named("DeviceClass", "gpu-share.gpuslice.io")["spec"] == {}
    assert [d["name"] for d in devices if "gpu.gpuslice.io/memory" in d["capacity"]] == ["gpu-0", "gpu-1"]


def test_a_custom_prefix_names_the_driver_and_its_classes():
    manifests = chartkit.render({**DRA, "config": {"resourcePrefix": "gpu.example.com"}}, "1.37.0")
    assert sorted(c["metadata"]["name"] for c in manifests.all("DeviceClass")) == [
        "gpu-share.gpu.example.com",
        "gpu.gpu.example.com",
        "mig.gpu.example.com",
    ]
    node = nodefile.load(chartkit.REPO / "gpuslice" / "examples" / "demo-node.yaml")
    published = slices.build_slices(node, contract.Contract(prefix="gpu.example.com"), "n")[0]["spec"]["driver"]
    expression = manifests.named("DeviceClass", "gpu.gpu.example.com")["spec"]["selectors"][0]["cel"]["expression"]
    assert f'device.driver == "{published}"' in expression


SLICE_CASES = [
    # (id, operation, node of the slice after, node before, driver, node claimed by the token, allowed)
    ("create-own-node", "CREATE", "gpu-1", None, "gpu.gpuslice.io", "gpu-1", True),
    ("update-own-node", "UPDATE", "gpu-1", "gpu-1", "gpu.gpuslice.io", "gpu-1", True),
    ("delete-own-node", "DELETE", None, "gpu-1", "gpu.gpuslice.io", "gpu-1", True),
    ("create-other-node", "CREATE", "gpu-2", None, "gpu.gpuslice.io", "gpu-1", False),
    ("move-to-other-node", "UPDATE", "gpu-2", "gpu-1", "gpu.gpuslice.io", "gpu-1", False),
    ("take-over-other-node", "UPDATE", "gpu-1", "gpu-2", "gpu.gpuslice.io", "gpu-1", False),
    ("delete-other-node", "DELETE", None, "gpu-2", "gpu.gpuslice.io", "gpu-1", False),
    ("other-driver", "CREATE", "gpu-1", None, "gpu.example.com", "gpu-1", False),
    ("token-without-node-claim", "CREATE", "gpu-1", None, "gpu.gpuslice.io", None, False),
]


@pytest.mark.parametrize(
    ("case", "operation", "after", "before", "driver", "claim", "allowed"), SLICE_CASES, ids=[c[0] for c in SLICE_CASES]
)
def test_the_slice_policy_confines_the_dra_plugin_to_its_own_nodes_slices(
    case, operation, after, before, driver, claim, allowed
):
    # The real API server enforces it in tests/e2e/test_real_slice_policy.py; here its CEL alone.

    manifests = chartkit.render(DRA, "1.37.0")
    (policy,) = [
        p for p in manifests.all("ValidatingAdmissionPolicy") if p["metadata"]["name"].endswith("-resource-slices")
    ]
    binding = manifests.named("ValidatingAdmissionPolicyBinding", policy["metadata"]["name"])
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    plugin_sa = manifests.one("ServiceAccount", "dra-plugin")["metadata"]["name"]
    extra = {"authentication.kubernetes.io/node-name": [claim]} if claim else {}

    def request(username: str) -> dict:
        def slice_(node):
            return {"spec": {"driver": driver if node == after else "gpu.gpuslice.io", "nodeName": node}}

        return {
            "request": {"userInfo": {"username": username, "extra": extra}, "operation": operation},
            "object": slice_(after) if after else None,
            "oldObject": slice_(before) if before else None,
        }

    matched, failed = chartkit.evaluate_policy(
        policy, request(f"system:serviceaccount:{chartkit.NAMESPACE}:{plugin_sa}")
    )
    assert matched and (not failed) is allowed, failed
    assert chartkit.evaluate_policy(policy, request("system:node:gpu-1")) == (False, [])  # not its business


def test_the_slice_policy_comes_with_dra_mode_and_the_node_write_policies():
    def named(values):
        return [p["metadata"]["name"] for p in chartkit.render(values, "1.37.0").all("ValidatingAdmissionPolicy")]

    assert "gpuslice-resource-slices" in named(DRA) and "gpuslice-resource-slices" in named(BOTH)
    assert "gpuslice-resource-slices" not in named({})
    unconfined = {**DRA, "devicePlugin": {"nodePatchPolicy": {"enabled": False, "allowUnconfinedNodeWrites": True}}}
    assert named(unconfined) == ["gpuslice-share-requests"]  # not a write confinement: the share class's guard


def _share_request(device_class: str, capacity: dict | None) -> dict:
    request = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": 1}
    return {**request, "capacity": {"requests": capacity}} if capacity is not None else request


SHARE = "gpu-share.gpuslice.io"
SHARE_CASES = [
    # (id, the claim's requests, allowed)
    ("share-with-capacity", [{"name": "a", "exactly": _share_request(SHARE, {"gpu.gpuslice.io/memory": "2Gi"})}], True),
    ("share-without-capacity", [{"name": "a", "exactly": _share_request(SHARE, None)}], False),
    ("share-with-another-capacity", [{"name": "a", "exactly": _share_request(SHARE, {"memory": "2Gi"})}], False),
    ("whole-gpus", [{"name": "a", "exactly": _share_request("gpu.gpuslice.io", None)}], True),
    ("whole-gpu-by-tag", [{"name": "a", "exactly": _share_request(SHARE, {"gpu.gpuslice.io/whole": "1"})}], True),
    ("gpu-size-by-tag", [{"name": "a", "exactly": _share_request(SHARE, {"gpu.gpuslice.io/m81920": "1"})}], True),
    (
        "another-domains-tag",  # the driver's domain is matched with its slash, not as a prefix
        [{"name": "a", "exactly": _share_request(SHARE, {"gpu.gpuslice.iox/whole": "1"})}],
        False,
    ),
    (
        "alternative-without-capacity",
        [
            {
                "name": "a",
                "firstAvailable": [
                    {"name": "m", **_share_request("mig.gpuslice.io", None)},
                    {"name": "s", **_share_request(SHARE, None)},
                ],
            }
        ],
        False,
    ),
    (
        "second-request-without-capacity",
        [
            {"name": "a", "exactly": _share_request(SHARE, {"gpu.gpuslice.io/memory": "2Gi"})},
            {"name": "b", "exactly": _share_request(SHARE, None)},
        ],
        False,
    ),
    ("no-requests", None, True),
]


@pytest.mark.parametrize(("case", "requests", "allowed"), SHARE_CASES, ids=[c[0] for c in SHARE_CASES])
@pytest.mark.parametrize("kind", ["ResourceClaim", "ResourceClaimTemplate"])
def test_the_share_policy_refuses_a_share_request_without_the_shares_capacity(case, requests, allowed, kind):
    # The real API server enforces it in tests/e2e/test_real_share_policy.py; here its CEL alone.
    manifests = chartkit.render(DRA, "1.37.0")
    policy = manifests.named("ValidatingAdmissionPolicy", "gpuslice-share-requests")
    binding = manifests.named("ValidatingAdmissionPolicyBinding", "gpuslice-share-requests")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    claim_spec = {"devices": {"requests": requests}} if requests is not None else {}
    spec = {"spec": claim_spec} if kind == "ResourceClaimTemplate" else claim_spec
    matched, failed = chartkit.evaluate_policy(policy, {"object": {"kind": kind, "spec": spec}})
    assert matched and (not failed) is allowed, failed
