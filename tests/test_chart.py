"""The Helm chart, rendered by the real (pinned) helm: lint, schema validity for Kubernetes 1.29 to
1.35, and what a careful platform team checks: TLS, admission scoping, RBAC, pod security, mounts,
the shared configuration and the bin-packing scheduler profile."""

from __future__ import annotations

import base64
import datetime
import functools
import ipaddress
import json
from typing import Any

import celpy
import chartkit
import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gpuslice import config, contract

pytestmark = pytest.mark.helm

CRD_KINDS = {"Certificate", "Issuer", "ServiceMonitor"}  # no schema in kubernetes-validate: checked by shape
SELECTOR_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component")
COMBINATION_IDS = list(chartkit.COMBINATIONS)


def rendered(combination: str, kube_version: str = chartkit.KUBE_VERSIONS[-1]) -> chartkit.Manifests:
    return chartkit.render(chartkit.COMBINATIONS[combination], kube_version)


def prefix_of(combination: str) -> str:
    return chartkit.COMBINATIONS[combination].get("config", {}).get("resourcePrefix", contract.DEFAULT_PREFIX)


def webhook_entries(manifests: chartkit.Manifests) -> dict[str, dict[str, Any]]:
    """The MutatingWebhookConfiguration's entries by the first word of their name ("pods", "cpu-pods")."""
    hooks = manifests.one("MutatingWebhookConfiguration")["webhooks"]
    entries = {hook["name"].split(".", 1)[0]: hook for hook in hooks}
    assert len(entries) == len(hooks), [hook["name"] for hook in hooks]
    return entries


def webhook_configuration(manifests: chartkit.Manifests, entry: str = "pods") -> dict[str, Any]:
    return webhook_entries(manifests)[entry]


def shared_config(manifests: chartkit.Manifests, tmp_path) -> config.Config:
    """The rendered config.yaml, loaded the way both components load it."""
    path = tmp_path / "config.yaml"
    path.write_text(manifests.one("ConfigMap", "config")["data"]["config.yaml"])
    return config.load(path, environ={})


# --- helm lint and schema validation --------------------------------------------------------------


@pytest.mark.parametrize("combination", ["defaults", "everything"])
def test_helm_lint_is_clean_even_with_strict(combination, tmp_path):
    values = chartkit.values_file(chartkit.COMBINATIONS[combination], tmp_path)
    result = chartkit.run_helm("lint", "--strict", str(chartkit.CHART), "-f", str(values))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout


# A render for Kubernetes 1.30 to 1.35 differs only in the default kube-scheduler tag; 1.29 also
# leaves out the ValidatingAdmissionPolicy. So each combination is rendered for 1.29 and 1.35 and the
# default values for every version, and each render is validated against every version it stands for.
VALIDATION_CASES = [
    pytest.param(combination, render_version, schema_version, id=f"{combination}-{schema_version[:4]}")
    for combination in COMBINATION_IDS
    for schema_version in chartkit.KUBE_VERSIONS
    for render_version in [
        schema_version
        if combination == "defaults" or schema_version == chartkit.KUBE_VERSIONS[0]
        else chartkit.KUBE_VERSIONS[-1]
    ]
]


@pytest.mark.parametrize(("combination", "render_version", "schema_version"), VALIDATION_CASES)
def test_rendered_manifests_validate_strictly_for_kubernetes_1_29_to_1_35(combination, render_version, schema_version):
    manifests = rendered(combination, render_version)
    checked = [obj for obj in manifests if obj["kind"] not in CRD_KINDS]
    problems = [
        f"{obj['kind']}/{obj['metadata']['name']}: {error}"
        for obj in checked
        for error in chartkit.schema_errors(obj, schema_version)
    ]
    assert not problems, f"invalid for Kubernetes {schema_version}:\n" + "\n".join(problems)
    assert len(checked) >= 10


@pytest.mark.parametrize("kube_version", [chartkit.KUBE_VERSIONS[0], chartkit.KUBE_VERSIONS[-1]])
def test_the_fast_schema_check_agrees_with_kubernetes_validate(kube_version):
    manifests = rendered("everything", kube_version)
    for obj in manifests:
        if obj["kind"] in CRD_KINDS:
            with pytest.raises(chartkit.NoSchema):
                chartkit.schema_errors(obj, kube_version)
            continue
        assert kubernetes_validate.validate(obj, kube_version, strict=True)
        assert chartkit.schema_errors(obj, kube_version) == []
    # Both refuse what the API server would: an unknown field, a wrong type.
    deployment = json.loads(json.dumps(manifests.one("Deployment", "webhook")))
    deployment["spec"]["replicas"] = "two"
    deployment["spec"]["template"]["spec"]["hostNetwrok"] = True
    errors = chartkit.schema_errors(deployment, kube_version)
    assert any("spec.replicas" in e for e in errors) and any("hostNetwrok" in e for e in errors)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, kube_version, strict=True)


@pytest.mark.parametrize("combination", ["cert-manager", "service-monitor", "everything"])
def test_custom_resources_have_the_shape_their_operators_expect(combination):
    manifests = rendered(combination)
    service = manifests.one("Service", "webhook")
    for obj in manifests:
        if obj["kind"] not in CRD_KINDS:
            continue
        assert obj["metadata"]["namespace"] == chartkit.NAMESPACE
        if obj["kind"] in ("Certificate", "Issuer"):
            assert obj["apiVersion"] == "cert-manager.io/v1"
            if obj["kind"] == "Certificate":
                issuer = manifests.named("Issuer", obj["spec"]["issuerRef"]["name"])
                assert obj["spec"]["issuerRef"]["kind"] == "Issuer" and issuer
                assert obj["spec"]["secretName"]
            else:
                assert set(obj["spec"]) & {"selfSigned", "ca"}
        else:
            assert obj["apiVersion"] == "monitoring.coreos.com/v1"
            (endpoint,) = obj["spec"]["endpoints"]
            matching = [
                svc
                for svc in manifests.all("Service")
                if all(svc["metadata"]["labels"].get(k) == v for k, v in obj["spec"]["selector"]["matchLabels"].items())
            ]
            assert len(matching) == 1, obj["metadata"]["name"]
            assert endpoint["port"] in {p["name"] for p in matching[0]["spec"]["ports"]}
            assert endpoint["path"] == "/metrics"
    if "Certificate" in manifests.kinds():
        volume = chartkit.volume(manifests.one("Deployment", "webhook"), "tls")
        serving = manifests.named("Certificate", volume["secret"]["secretName"])
        svc = service["metadata"]["name"]
        assert f"{svc}.{chartkit.NAMESPACE}.svc" in serving["spec"]["dnsNames"]
        assert "server auth" in serving["spec"]["usages"]


# --- TLS --------------------------------------------------------------------------------------------


def test_ca_bundle_verifies_the_serving_certificate_whose_san_covers_the_service():
    manifests = rendered("defaults")
    hook = webhook_configuration(manifests)
    ca_pem = base64.b64decode(hook["clientConfig"]["caBundle"])
    ca = x509.load_pem_x509_certificate(ca_pem)
    deployment = manifests.one("Deployment", "webhook")
    secret = manifests.named("Secret", chartkit.volume(deployment, "tls")["secret"]["secretName"])
    assert secret["type"] == "kubernetes.io/tls"
    serving = x509.load_pem_x509_certificate(chartkit.secret_bytes(secret, "tls.crt"))
    key = serialization.load_pem_private_key(chartkit.secret_bytes(secret, "tls.key"), password=None)

    serving.verify_directly_issued_by(ca)  # raises if the caBundle did not sign it
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert chartkit.secret_bytes(secret, "ca.crt") == ca_pem
    assert key.public_key().public_numbers() == serving.public_key().public_numbers()

    service = hook["clientConfig"]["service"]
    assert service["name"] == manifests.one("Service", "webhook")["metadata"]["name"]
    assert service["namespace"] == chartkit.NAMESPACE
    san = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns_names = set(san.get_values_for_type(x509.DNSName))
    svc = service["name"]
    assert f"{svc}.{chartkit.NAMESPACE}.svc" in dns_names  # the name the API server dials
    assert {svc, f"{svc}.{chartkit.NAMESPACE}", f"{svc}.{chartkit.NAMESPACE}.svc.cluster.local"} <= dns_names
    usage = serving.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert x509.oid.ExtendedKeyUsageOID.SERVER_AUTH in usage
    now = datetime.datetime.now(datetime.UTC)
    assert serving.not_valid_before_utc <= now < serving.not_valid_after_utc
    assert not any(isinstance(name, ipaddress.IPv4Address) for name in san)


def test_cert_manager_injects_the_ca_instead_of_a_chart_made_bundle():
    manifests = rendered("cert-manager")
    configuration = manifests.one("MutatingWebhookConfiguration")
    assert "caBundle" not in webhook_configuration(manifests)["clientConfig"]
    namespace, name = configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].split("/")
    certificate = manifests.named("Certificate", name)
    assert namespace == chartkit.NAMESPACE
    volume = chartkit.volume(manifests.one("Deployment", "webhook"), "tls")
    assert certificate["spec"]["secretName"] == volume["secret"]["secretName"]
    assert not [s for s in manifests.all("Secret") if s["metadata"]["name"] == volume["secret"]["secretName"]]


# --- admission scoping -----------------------------------------------------------------------------


@functools.cache
def cel_program(expression: str) -> celpy.Runner:
    """A CEL program; Kubernetes' strings library adds list.join, which cel-python lacks."""
    env = celpy.Environment()
    return env.program(env.compile(expression), functions={"join": lambda items, sep: sep.join(items)})


def pod(
    annotations: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    init_limits=None,
    *,
    labels: dict[str, str] | None = None,
    owner: str | None = None,
):
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "cuda"}]}
    if limits is not None:
        spec["containers"][0]["resources"] = {"limits": limits}
    if init_limits is not None:
        spec["initContainers"] = [{"name": "init", "image": "cuda", "resources": {"requests": init_limits}}]
    metadata: dict[str, Any] = {"name": "p"}
    if annotations is not None:
        metadata["annotations"] = annotations
    if labels is not None:
        metadata["labels"] = labels
    if owner is not None:
        owner_reference = {"apiVersion": "apps/v1", "kind": owner, "name": "o", "uid": "1", "controller": True}
        metadata["ownerReferences"] = [owner_reference]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


MATCH_CASES = [
    # (id, pod, sent by default, sent with convertWholeGpus)
    ("kai-gpu-fraction", pod({"gpu-fraction": "0.5"}), True, True),
    ("kai-gpu-memory", pod({"gpu-memory": "2000"}), True, True),
    ("kai-num-devices", pod({"gpu-fraction-num-devices": "2", "gpu-fraction": "0.5"}), True, True),
    ("kai-container-name", pod({"gpu-fraction-container-name": "main"}), True, True),
    ("isolation-annotation", pod({"{prefix}/isolation": "mig"}), True, True),
    ("no-annotations-at-all", pod(), False, False),
    ("unrelated-annotations", pod({"team": "ml"}), False, False),
    ("whole-gpu-limit", pod(limits={"nvidia.com/gpu": "1"}), False, True),
    ("whole-gpu-in-init-container", pod(init_limits={"nvidia.com/gpu": "1"}), False, True),
    ("cpu-only-limits", pod(limits={"cpu": "1"}), False, False),
]


@pytest.mark.parametrize("combination", ["defaults", "whole-gpu-conversion", "custom-prefix"])
@pytest.mark.parametrize(("case", "obj", "by_default", "when_converting"), MATCH_CASES, ids=[c[0] for c in MATCH_CASES])
def test_match_conditions_send_only_pods_that_ask_for_gpuslice(combination, case, obj, by_default, when_converting):
    prefix = prefix_of(combination)
    obj = json.loads(json.dumps(obj).replace("{prefix}", prefix))
    hook = webhook_configuration(rendered(combination))
    (condition,) = hook["matchConditions"]
    program = cel_program(condition["expression"])
    expected = when_converting if combination == "whole-gpu-conversion" else by_default
    assert bool(program.evaluate({"object": celpy.json_to_cel(obj)})) is expected


def sends(hook: dict[str, Any], obj: dict[str, Any]) -> bool:
    """Whether the API server calls this webhook entry for creating `obj` (a namespace it selects):
    the objectSelector over the pod's labels, then every matchCondition."""
    labels = obj["metadata"].get("labels", {})
    for requirement in hook.get("objectSelector", {}).get("matchExpressions", []):
        value = labels.get(requirement["key"])
        assert requirement["operator"] in ("In", "NotIn"), requirement  # the only ones the chart uses
        if (value is not None and value in requirement["values"]) is (requirement["operator"] == "NotIn"):
            return False
    assert not hook.get("objectSelector", {}).get("matchLabels")
    activation = {"object": celpy.json_to_cel(obj)}
    return all(bool(cel_program(c["expression"]).evaluate(activation)) for c in hook.get("matchConditions", []))


CPU_POD_CASES = [
    # (id, pod, sent to the cpu-pods entry)
    ("plain-cpu-pod", pod(limits={"cpu": "1", "memory": "1Gi"}), True),
    ("no-resources-at-all", pod(), True),
    ("unrelated-annotations", pod({"team": "ml"}), True),
    ("replicaset-owned", pod(owner="ReplicaSet"), True),
    ("opt-out-label-on", pod(labels={"{prefix}/cpu-pod-steering": "on"}), True),
    ("opt-out-label-off", pod(labels={"{prefix}/cpu-pod-steering": "off"}), False),
    ("kai-gpu-fraction", pod({"gpu-fraction": "0.5"}), False),
    ("kai-gpu-memory", pod({"gpu-memory": "2000"}), False),
    ("isolation-annotation", pod({"{prefix}/isolation": "mig"}), False),
    ("whole-gpu-limit", pod(limits={"nvidia.com/gpu": "1"}), False),
    ("whole-gpu-in-init-container", pod(init_limits={"nvidia.com/gpu": "1"}), False),
    ("daemonset-owned", pod(limits={"cpu": "100m"}, owner="DaemonSet"), False),
    ("daemonset-owned-whole-gpu", pod(limits={"nvidia.com/gpu": "1"}, owner="DaemonSet"), False),
    ("daemonset-owned-gpu-fraction", pod({"gpu-fraction": "0.5"}, owner="DaemonSet"), False),
]


@pytest.mark.parametrize("combination", ["defaults", "whole-gpu-conversion", "custom-prefix"])
@pytest.mark.parametrize(("case", "obj", "expected"), CPU_POD_CASES, ids=[c[0] for c in CPU_POD_CASES])
def test_cpu_pods_entry_sends_only_pods_that_ask_for_no_device_and_never_one_the_first_entry_sends(
    combination, case, obj, expected
):
    prefix = prefix_of(combination)
    obj = json.loads(json.dumps(obj).replace("{prefix}", prefix))
    entries = webhook_entries(rendered(combination))
    sent_for_gpuslice = sends(entries["pods"], obj)
    assert sends(entries["cpu-pods"], obj) is expected
    assert not (expected and sent_for_gpuslice), "both entries would mutate the same pod"
    # The first entry takes annotated pods always, pods asking for nvidia.com/gpu only with
    # convertWholeGpus; a DaemonSet's pod asking for nvidia.com/gpu without it goes to neither.
    keys = (*contract.KAI_ANNOTATIONS, f"{prefix}/isolation")
    annotated = any(k in obj["metadata"].get("annotations", {}) for k in keys)
    whole_gpu = "nvidia.com/gpu" in json.dumps(obj["spec"])
    assert sent_for_gpuslice is (annotated or (whole_gpu and combination == "whole-gpu-conversion"))


@pytest.mark.parametrize("combination", COMBINATION_IDS)
def test_cpu_pods_entry_fails_open_and_calls_the_same_service_as_the_first_entry(combination):
    manifests = rendered(combination)
    prefix = prefix_of(combination)
    first, cpu_pods = webhook_configuration(manifests), webhook_configuration(manifests, "cpu-pods")
    entries = [h["name"] for h in manifests.one("MutatingWebhookConfiguration")["webhooks"]]
    assert entries == [first["name"], cpu_pods["name"]]
    assert cpu_pods["name"] == f"cpu-pods.{prefix}"
    assert cpu_pods["failurePolicy"] == "Ignore"  # it sees ordinary pods: an outage must not block them
    assert cpu_pods["reinvocationPolicy"] == "Never"
    assert cpu_pods["matchPolicy"] == "Equivalent"
    assert cpu_pods["sideEffects"] == "None" and cpu_pods["admissionReviewVersions"] == ["v1"]
    for field in ("clientConfig", "rules", "namespaceSelector", "timeoutSeconds"):
        assert cpu_pods[field] == first[field], field  # caBundle included (cert-manager injects into both)
    assert cpu_pods["clientConfig"]["service"]["path"] == "/mutate"
    assert cpu_pods["objectSelector"] == {
        "matchExpressions": [
            {"key": contract.Contract(prefix=prefix).label_pod_cpu_steering, "operator": "NotIn", "values": ["off"]}
        ]
    }
    conditions = {c["name"] for c in cpu_pods["matchConditions"]}
    assert conditions == {"no-gpuslice-annotations", "asks-for-no-gpu", "not-a-daemonset-pod"}
    names = [*contract.KAI_ANNOTATIONS, contract.Contract(prefix=prefix).isolation_annotation]
    (annotations,) = [c for c in cpu_pods["matchConditions"] if c["name"] == "no-gpuslice-annotations"]
    assert all(f"'{name}'" in annotations["expression"] for name in names)


@pytest.mark.parametrize(
    "setting", ["config.steering.cpuPods=false", "config.steering.enabled=false"], ids=["cpu-pods-off", "steering-off"]
)
def test_cpu_pods_entry_is_left_out_when_cpu_pods_or_steering_is_off(setting, tmp_path):
    result = chartkit.run_helm(*chartkit.template_args({}, tmp_path, "--set", setting))
    assert result.returncode == 0, result.stderr
    manifests = chartkit.parse(result.stdout)
    assert list(webhook_entries(manifests)) == ["pods"]
    assert webhook_configuration(manifests) == webhook_configuration(rendered("defaults")) | {
        "clientConfig": webhook_configuration(manifests)["clientConfig"]  # a fresh CA each render
    }
    settings = shared_config(manifests, tmp_path)
    assert not (settings.steering.enabled and settings.steering.cpu_pods)


@pytest.mark.parametrize("combination", COMBINATION_IDS)
def test_webhook_configuration_is_safe_to_fail_closed(combination):
    manifests = rendered(combination)
    hook = webhook_configuration(manifests)
    assert hook["name"] == f"pods.{prefix_of(combination)}"
    assert hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert 1 <= hook["timeoutSeconds"] <= 10
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["failurePolicy"] == "Fail"
    assert hook["matchConditions"], "failurePolicy Fail without matchConditions would gate every pod"
    names = [*contract.KAI_ANNOTATIONS, contract.Contract(prefix=prefix_of(combination)).isolation_annotation]
    (condition,) = hook["matchConditions"]
    assert all(f"'{name}'" in condition["expression"] for name in names)  # the contract's names, every one
    assert hook["rules"] == [
        {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}
    ]
    (expression,) = hook["namespaceSelector"]["matchExpressions"]
    assert expression["key"] == "kubernetes.io/metadata.name" and expression["operator"] == "NotIn"
    shared = chartkit.COMBINATIONS[combination].get("config", {}).get("ignoredNamespaces", [])
    assert {"kube-system", chartkit.NAMESPACE, *shared} <= set(expression["values"])
    service = hook["clientConfig"]["service"]
    assert service["path"] == "/mutate"
    svc = manifests.named("Service", service["name"])
    (port,) = [p for p in svc["spec"]["ports"] if p["port"] == service["port"]]
    webhook_container = chartkit.container(manifests.one("Deployment", "webhook"))
    assert port["targetPort"] in {p["name"] for p in webhook_container["ports"]}
    assert {p["containerPort"] for p in webhook_container["ports"]} == {int(chartkit.arg_value(webhook_container, "--port"))}


# --- RBAC -------------------------------------------------------------------------------------------

ALLOWED_STOCK_ROLES = {"system:kube-scheduler", "system:volume-scheduler", "extension-apiserver-authentication-reader"}


@pytest.mark.parametrize("combination", COMBINATION_IDS)
def test_rbac_has_no_wildcards_and_nothing_cluster_admin(combination):
    manifests = rendered(combination)
    own_roles = {(r["kind"], r["metadata"]["name"]) for r in manifests.all("ClusterRole") + manifests.all("Role")}
    for role in manifests.all("ClusterRole") + manifests.all("Role"):
        assert "aggregationRule" not in role
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                assert not any("*" in item for item in rule.get(field, [])), (role["metadata"]["name"], rule)
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
            assert "secrets" not in rule.get("resources", [])
    for binding in manifests.all("ClusterRoleBinding") + manifests.all("RoleBinding"):
        ref = binding["roleRef"]
        assert (ref["kind"], ref["name"]) in own_roles or ref["name"] in ALLOWED_STOCK_ROLES, ref
        assert all(s["kind"] == "ServiceAccount" and s["namespace"] == chartkit.NAMESPACE for s in binding["subjects"])


def rules_of(manifests: chartkit.Manifests, component: str) -> list[dict[str, Any]]:
    return manifests.one("ClusterRole", component)["rules"]


def test_webhook_may_only_read_nodes_and_the_plugin_only_label_nodes_and_list_pods():
    manifests = rendered("defaults")
    assert rules_of(manifests, "webhook") == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    assert rules_of(manifests, "device-plugin") == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},  # its node's CPU/memory headroom
    ]
    for component in ("webhook", "device-plugin"):
        binding = manifests.one("ClusterRoleBinding", component)
        (subject,) = binding["subjects"]
        service_account = manifests.one("ServiceAccount", component)
        assert subject["name"] == service_account["metadata"]["name"]
        workload = manifests.one("Deployment" if component == "webhook" else "DaemonSet", component)
        assert chartkit.pod_spec(workload)["serviceAccountName"] == subject["name"]


def test_scheduler_binds_only_the_stock_scheduler_roles_and_its_own_lease():
    manifests = rendered("binpack-scheduler")
    refs = {b["roleRef"]["name"] for b in manifests.all("ClusterRoleBinding", "scheduler")}
    assert refs == {"system:kube-scheduler", "system:volume-scheduler"}
    (reader,) = [b for b in manifests.all("RoleBinding", "scheduler") if b["metadata"]["namespace"] == "kube-system"]
    assert reader["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "extension-apiserver-authentication-reader",
    }
    scheduler_config = yaml.safe_load(manifests.one("ConfigMap", "scheduler")["data"]["scheduler-config.yaml"])
    election = scheduler_config["leaderElection"]
    assert election["leaderElect"] and election["resourceNamespace"] == chartkit.NAMESPACE
    (role,) = manifests.all("Role", "scheduler")
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert named == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [election["resourceName"]], "verbs": ["get", "update"]}
    ]


# --- the device plugin's node-patch policy -----------------------------------------------------------


def admission_request(username: str, node: str, old: dict[str, Any], new: dict[str, Any], node_claim: str | None):
    extra = {"authentication.kubernetes.io/node-name": [node_claim]} if node_claim else {}
    return {
        "request": {"userInfo": {"username": username, "extra": extra}},
        "object": {"metadata": {"name": node, **new.get("metadata", {})}, "spec": new.get("spec", {})},
        "oldObject": {"metadata": {"name": node, **old.get("metadata", {})}, "spec": old.get("spec", {})},
    }


def evaluate_policy(policy: dict[str, Any], request: dict[str, Any]) -> tuple[bool, list[str]]:
    """(matched, failed validation messages) of a ValidatingAdmissionPolicy for one request."""
    activation = {k: celpy.json_to_cel(v) for k, v in request.items()}
    spec = policy["spec"]
    if not all(cel_program(c["expression"]).evaluate(activation) for c in spec.get("matchConditions", [])):
        return False, []
    variables: dict[str, Any] = {}
    for variable in spec.get("variables", []):
        variables[variable["name"]] = cel_program(variable["expression"]).evaluate(
            {**activation, "variables": celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in variables.items()})}
        )
    activation["variables"] = celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in variables.items()})
    failed = [v.get("message", v.get("messageExpression", "")) for v in spec["validations"] if not cel_program(v["expression"]).evaluate(activation)]
    return True, failed


BASE_LABELS = {"kubernetes.io/hostname": "gpu-1", "{prefix}/enabled": "true", "{prefix}/gpu.free-units": "320"}
POLICY_CASES = [
    # (id, changes to labels (None deletes), spec after, node claimed by the token, allowed)
    ("own-node-prefix-label", {"{prefix}/gpu.free-units": "300"}, {}, "gpu-1", True),
    ("own-node-new-prefix-label", {"{prefix}/gpu.placement-score": "80"}, {}, "gpu-1", True),
    ("own-node-removes-prefix-label", {"{prefix}/gpu.free-units": None}, {}, "gpu-1", True),
    ("other-node", {"{prefix}/gpu.free-units": "300"}, {}, "gpu-2", False),
    ("token-without-node-claim", {"{prefix}/gpu.free-units": "300"}, {}, None, False),
    ("foreign-label", {"node-role.kubernetes.io/control-plane": ""}, {}, "gpu-1", False),
    ("removes-opt-in-label", {"{prefix}/enabled": None}, {}, "gpu-1", False),
    ("changes-hostname-label", {"kubernetes.io/hostname": "x"}, {}, "gpu-1", False),
    ("adds-a-taint", {}, {"taints": [{"key": "k", "effect": "NoSchedule"}]}, "gpu-1", False),
]


@pytest.mark.parametrize("combination", ["defaults", "custom-prefix"])
@pytest.mark.parametrize(("case", "changes", "spec", "claim", "allowed"), POLICY_CASES, ids=[c[0] for c in POLICY_CASES])
def test_node_patch_policy_confines_the_plugin_to_its_own_nodes_prefixed_labels(combination, case, changes, spec, claim, allowed):
    prefix = prefix_of(combination)
    manifests = rendered(combination)
    policy = manifests.one("ValidatingAdmissionPolicy")
    binding = manifests.one("ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    old_labels = {k.replace("{prefix}", prefix): v for k, v in BASE_LABELS.items()}
    new_labels = dict(old_labels)
    for key, value in changes.items():
        key = key.replace("{prefix}", prefix)
        if value is None:
            new_labels.pop(key)
        else:
            new_labels[key] = value
    plugin_sa = manifests.one("ServiceAccount", "device-plugin")["metadata"]["name"]
    username = f"system:serviceaccount:{chartkit.NAMESPACE}:{plugin_sa}"
    request = admission_request(username, "gpu-1", {"metadata": {"labels": old_labels}}, {"metadata": {"labels": new_labels}, "spec": spec}, claim)
    matched, failed = evaluate_policy(policy, request)
    assert matched
    assert (not failed) is allowed, failed
    # Anybody else's writes are not this policy's business.
    other = admission_request("system:node:gpu-1", "gpu-1", {"metadata": {"labels": old_labels}}, {"metadata": {"labels": new_labels}}, claim)
    assert evaluate_policy(policy, other) == (False, [])


@pytest.mark.parametrize(("kube_version", "expected"), [("1.29.0", False), ("1.30.0", True), ("1.35.0", True)])
def test_node_patch_policy_is_installed_where_the_api_and_the_node_claim_exist(kube_version, expected):
    kinds = chartkit.render({}, kube_version).kinds()
    assert ("ValidatingAdmissionPolicy" in kinds) is expected
    assert ("ValidatingAdmissionPolicyBinding" in kinds) is expected


# --- pod security ----------------------------------------------------------------------------------


def assert_locked_down(workload: dict[str, Any], *, non_root: bool) -> None:
    spec = chartkit.pod_spec(workload)
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(flag), flag
    for c in spec["containers"]:
        context = c["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["readOnlyRootFilesystem"] is True
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert not context.get("privileged")
        if non_root:
            assert spec["securityContext"]["runAsNonRoot"] is True
            assert spec["securityContext"]["runAsUser"] != 0
        assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]


@pytest.mark.parametrize("combination", [c for c in COMBINATION_IDS if c != "driver-root"] + ["driver-root"])
def test_every_pod_runs_locked_down(combination):
    manifests = rendered(combination)
    assert_locked_down(manifests.one("Deployment", "webhook"), non_root=True)
    assert_locked_down(manifests.one("DaemonSet", "device-plugin"), non_root=False)
    for scheduler in manifests.all("Deployment", "scheduler"):
        assert_locked_down(scheduler, non_root=True)


def test_device_plugin_is_privileged_only_when_asked_for_driver_root_without_a_runtime():
    manifests = chartkit.render({"devicePlugin": {"runtimeClassName": "", "driverRoot": "/run/nvidia/driver", "privileged": True}})
    daemonset = manifests.one("DaemonSet", "device-plugin")
    assert chartkit.container(daemonset)["securityContext"]["privileged"] is True


def test_webhook_probes_use_https_on_healthz_and_readyz():
    deployment = rendered("defaults").one("Deployment", "webhook")
    webhook = chartkit.container(deployment)
    assert webhook["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
    assert webhook["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    assert chartkit.arg_value(webhook, "--tls-cert-file") == "/tls/tls.crt"
    assert chartkit.arg_value(webhook, "--tls-private-key-file") == "/tls/tls.key"
    assert chartkit.mount_for(webhook, "/tls")["readOnly"] is True
    assert "subPath" not in chartkit.mount_for(webhook, "/tls")  # subPath mounts never see renewed files


def test_webhook_keeps_two_replicas_spread_across_nodes_under_a_disruption_budget():
    manifests = rendered("defaults")
    deployment = manifests.one("Deployment", "webhook")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    spread = chartkit.pod_spec(deployment)["topologySpreadConstraints"]
    assert "kubernetes.io/hostname" in {c["topologyKey"] for c in spread}
    anti = chartkit.pod_spec(deployment)["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    for term in [*spread, anti[0]["podAffinityTerm"]]:
        assert term["labelSelector"]["matchLabels"].items() <= pod_labels.items()
    budget = manifests.one("PodDisruptionBudget", "webhook")
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    service = manifests.one("Service", "webhook")
    assert service["spec"]["selector"].items() <= pod_labels.items()


# --- the device plugin's DaemonSet -----------------------------------------------------------------


def host_path_for(daemonset: dict[str, Any], mount_path: str) -> dict[str, Any]:
    plugin = chartkit.container(daemonset)
    mount = chartkit.mount_for(plugin, mount_path)
    assert mount is not None, f"nothing mounted at {mount_path}"
    return chartkit.volume(daemonset, mount["name"])["hostPath"]


@pytest.mark.parametrize("combination", COMBINATION_IDS)
def test_daemonset_mounts_the_kubelet_directories_the_plugin_is_told_about(combination):
    daemonset = rendered(combination).one("DaemonSet", "device-plugin")
    plugin = chartkit.container(daemonset)
    kubelet_dir = chartkit.arg_value(plugin, "--kubelet-dir")
    assert host_path_for(daemonset, kubelet_dir) == {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}
    socket = chartkit.arg_value(plugin, "--pod-resources-socket")
    assert socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    # The directory, not the socket: kubelet re-creates the socket and a bind-mounted one goes stale.
    socket_dir = socket.rsplit("/", 1)[0]
    assert host_path_for(daemonset, socket_dir) == {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}
    assert not any(v.get("hostPath", {}).get("type") == "Socket" for v in chartkit.pod_spec(daemonset)["volumes"])
    assert chartkit.arg_value(plugin, "--node-name") == "$(NODE_NAME)"
    (node_name,) = [e for e in plugin["env"] if e["name"] == "NODE_NAME"]
    assert node_name["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    port = int(chartkit.arg_value(plugin, "--http-port"))
    assert plugin["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    assert plugin["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert plugin["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}


@pytest.mark.parametrize("combination", COMBINATION_IDS)
def test_daemonset_mounts_mps_and_cdi_directories_only_when_configured(combination, tmp_path):
    manifests = rendered(combination)
    settings = shared_config(manifests, tmp_path)
    daemonset = manifests.one("DaemonSet", "device-plugin")
    host_paths = {v["hostPath"]["path"] for v in chartkit.pod_spec(daemonset)["volumes"] if "hostPath" in v}
    assert (settings.mps.pipe_directory in host_paths) is settings.mps.enabled
    if settings.mps.enabled:
        assert host_path_for(daemonset, settings.mps.pipe_directory)["path"] == settings.mps.pipe_directory
    assert ("/var/run/cdi" in host_paths) is (settings.device_list_strategy == "cdi-cri")
    expected = {"/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources"}
    expected |= {settings.mps.pipe_directory} if settings.mps.enabled else set()
    expected |= {"/var/run/cdi"} if settings.device_list_strategy == "cdi-cri" else set()
    expected |= {"/run/nvidia/driver"} if combination == "driver-root" else set()
    assert host_paths == expected


def test_daemonset_runs_on_opted_in_gpu_nodes_with_nvml_from_the_nvidia_runtime():
    spec = chartkit.pod_spec(rendered("defaults").one("DaemonSet", "device-plugin"))
    assert spec["nodeSelector"] == {contract.Contract().label_node_enabled: "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["runtimeClassName"] == "nvidia"
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    custom = chartkit.pod_spec(rendered("custom-prefix").one("DaemonSet", "device-plugin"))
    assert custom["nodeSelector"] == {contract.Contract(prefix="gpu.example.com").label_node_enabled: "true"}


def test_driver_root_mode_mounts_the_driver_read_only_and_drops_the_runtime_class():
    daemonset = rendered("driver-root").one("DaemonSet", "device-plugin")
    assert "runtimeClassName" not in chartkit.pod_spec(daemonset)
    plugin = chartkit.container(daemonset)
    assert chartkit.mount_for(plugin, "/driver-root")["readOnly"] is True
    assert host_path_for(daemonset, "/driver-root") == {"path": "/run/nvidia/driver", "type": "Directory"}
    library_path = next(e["value"] for e in plugin["env"] if e["name"] == "LD_LIBRARY_PATH")
    assert all(part.startswith("/driver-root/") for part in library_path.split(":"))


# --- the shared configuration ----------------------------------------------------------------------


@pytest.mark.parametrize("combination", COMBINATION_IDS)
def test_both_components_read_the_same_configmap_which_validates(combination, tmp_path):
    manifests = rendered(combination)
    configmap = manifests.one("ConfigMap", "config")
    settings = shared_config(manifests, tmp_path)
    for workload in (manifests.one("Deployment", "webhook"), manifests.one("DaemonSet", "device-plugin")):
        main = chartkit.container(workload)
        path = chartkit.arg_value(main, "--config")
        directory, filename = path.rsplit("/", 1)
        mount = chartkit.mount_for(main, directory)
        assert mount and mount["readOnly"] is True
        source = chartkit.volume(workload, mount["name"])["configMap"]
        assert source["name"] == configmap["metadata"]["name"]
        assert {"key": "config.yaml", "path": filename} in source["items"]
        # A changed configuration rolls the pods.
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert len(annotations["checksum/config"]) == 64
    values = chartkit.COMBINATIONS[combination]
    assert settings.resource_prefix == prefix_of(combination)
    assert settings.mps.enabled is values.get("config", {}).get("mps", {}).get("enabled", False)
    assert settings.convert_whole_gpus is values.get("config", {}).get("convertWholeGpus", False)
    scheduler_on = values.get("scheduler", {}).get("enabled", False)
    assert settings.scheduler_name == ("gpuslice-binpack" if scheduler_on else "")


def test_values_config_covers_exactly_the_configuration_schema():
    values = yaml.safe_load((chartkit.CHART / "values.yaml").read_text())

    def paths(mapping: dict[str, Any], prefix: str = "") -> set[str]:
        out: set[str] = set()
        for key, value in mapping.items():
            out |= paths(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key}
        return out

    assert paths(values["config"]) == {field.path for field in config.FIELDS}
    assert config.load(overrides=dict(_flatten(values["config"])), environ={}) == config.Config()


def _flatten(mapping: dict[str, Any], prefix: str = ""):
    for key, value in mapping.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield prefix + key, value


def test_values_schema_checks_config_as_the_components_would():
    schema = json.loads((chartkit.CHART / "values.schema.json").read_text())
    kinds = {bool: "boolean", int: "integer", float: "number", str: "string", tuple: "array"}

    def leaves(node: dict[str, Any], prefix: str = ""):
        for key, prop in node["properties"].items():
            assert node["additionalProperties"] is False, prefix
            if prop["type"] == "object":
                yield from leaves(prop, f"{prefix}{key}.")
            else:
                yield prefix + key, prop["type"]

    assert dict(leaves(schema["properties"]["config"])) == {f.path: kinds[f.kind] for f in config.FIELDS}


def test_config_changes_roll_the_pods():
    plain = rendered("defaults").one("DaemonSet", "device-plugin")
    changed = rendered("mps").one("DaemonSet", "device-plugin")
    annotations = [w["spec"]["template"]["metadata"]["annotations"] for w in (plain, changed)]
    assert annotations[0]["checksum/config"] != annotations[1]["checksum/config"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"config": {"resourcePrefix": "Not_A_Prefix"}}, "resourcePrefix"),
        ({"config": {"memoryUnitMiB": 0}}, "memoryUnitMiB"),
        ({"config": {"deviceListStrategy": "volume-mounts"}}, "deviceListStrategy"),
        ({"config": {"mps": {"enable": True}}}, "enable"),
        ({"config": {"memoryUnitMb": 512}}, "memoryUnitMb"),
        ({"scheduler": {"weights": {"gpuMemory": 500}}}, "gpuMemory"),
        ({"webhook": {"timeoutSeconds": 60}}, "timeoutSeconds"),
        ({"scheduler": {"enabled": True}, "config": {"schedulerName": "other"}}, "config.schedulerName"),
    ],
    ids=[
        "bad-prefix",
        "zero-unit",
        "unknown-strategy",
        "misspelt-nested-key",
        "misspelt-key",
        "weight-over-100",
        "timeout-over-30",
        "scheduler-name-mismatch",
    ],
)
def test_bad_values_are_refused_with_a_message_naming_them(values, message, tmp_path):
    result = chartkit.run_helm(*chartkit.template_args(values, tmp_path))
    assert result.returncode != 0
    assert message in result.stderr


# --- the bin-packing scheduler ------------------------------------------------------------------------


@pytest.mark.parametrize("combination", ["binpack-scheduler", "custom-prefix"])
def test_binpack_profile_weights_gpu_memory_under_most_allocated(combination, tmp_path):
    manifests = rendered(combination)
    settings = shared_config(manifests, tmp_path)
    scheduler_config = yaml.safe_load(manifests.one("ConfigMap", "scheduler")["data"]["scheduler-config.yaml"])
    assert scheduler_config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert scheduler_config["kind"] == "KubeSchedulerConfiguration"
    (profile,) = scheduler_config["profiles"]
    assert profile["schedulerName"] == settings.scheduler_name == "gpuslice-binpack"
    (fit,) = [p for p in profile["pluginConfig"] if p["name"] == "NodeResourcesFit"]
    strategy = fit["args"]["scoringStrategy"]
    assert strategy["type"] == "MostAllocated"
    weights = {r["name"]: r["weight"] for r in strategy["resources"]}
    expected = chartkit.COMBINATIONS[combination]["scheduler"].get("weights", {}).get("gpuMemory", 10)
    assert weights == {"cpu": 1, "memory": 1, settings.contract.gpu_memory_resource: expected}
    assert all(1 <= w <= 100 for w in weights.values())


def test_scheduler_runs_the_stock_image_of_the_cluster_version_on_its_configuration():
    manifests = chartkit.render({"scheduler": {"enabled": True}}, "1.31.0")
    deployment = manifests.one("Deployment", "scheduler")
    scheduler = chartkit.container(deployment)
    assert scheduler["image"] == "registry.k8s.io/kube-scheduler:v1.31.0"
    path = chartkit.arg_value(scheduler, "--config")
    directory, filename = path.rsplit("/", 1)
    mount = chartkit.mount_for(scheduler, directory)
    source = chartkit.volume(deployment, mount["name"])["configMap"]
    configmap = manifests.named("ConfigMap", source["name"])
    assert filename in configmap["data"]
    pinned = chartkit.render({"scheduler": {"enabled": True, "image": {"tag": "v1.33.4"}}}, "1.31.0")
    assert chartkit.container(pinned.one("Deployment", "scheduler"))["image"].endswith(":v1.33.4")


def test_no_scheduler_objects_unless_enabled():
    assert not rendered("defaults").all("Deployment", "scheduler")
    assert not [o for o in rendered("defaults") if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "scheduler"]


# --- metadata, notes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("combination", COMBINATION_IDS)
def test_every_object_carries_the_app_kubernetes_io_labels(combination):
    for obj in rendered(combination):
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "gpuslice"
        assert labels["app.kubernetes.io/instance"] == chartkit.RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/version"] and labels["app.kubernetes.io/component"]
        for workload_kind in ("Deployment", "DaemonSet"):
            if obj["kind"] == workload_kind:
                selector = obj["spec"]["selector"]["matchLabels"]
                assert set(selector) == set(SELECTOR_LABELS)
                assert selector.items() <= obj["spec"]["template"]["metadata"]["labels"].items()


def test_notes_tell_how_to_annotate_a_pod_and_check_the_result():
    result = chartkit.run_helm(
        "install", chartkit.RELEASE, str(chartkit.CHART), "--namespace", chartkit.NAMESPACE, "--dry-run=client"
    )
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    c = contract.Contract()
    assert f"{contract.KAI_GPU_FRACTION}: " in notes
    assert c.decision_annotation in notes
    assert "kubectl describe node" in notes and c.gpu_memory_resource in notes
    assert f"{c.label_node_enabled}=true" in notes


def test_webhook_only_install_leaves_out_every_node_side_object():
    manifests = chartkit.render({"devicePlugin": {"enabled": False}, "serviceMonitor": {"enabled": True}})
    node_side = [o for o in manifests if o["metadata"]["labels"]["app.kubernetes.io/component"] == "device-plugin"]
    assert node_side == []
    assert manifests.one("Deployment", "webhook") and manifests.one("ServiceMonitor", "webhook")
    for obj in manifests:
        if obj["kind"] not in CRD_KINDS:
            assert chartkit.schema_errors(obj, chartkit.KUBE_VERSIONS[-1]) == []


@pytest.mark.parametrize("combination", ["defaults", "custom-prefix", "everything"])
def test_the_components_accept_the_arguments_the_chart_gives_them(combination, tmp_path):
    from gpuslice.deviceplugin import main as deviceplugin_main
    from gpuslice.webhook import main as webhook_main

    manifests = rendered(combination)
    expected = shared_config(manifests, tmp_path)
    config_file = tmp_path / "config.yaml"

    def with_local_config(container_spec: dict[str, Any]) -> list[str]:
        return [f"--config={config_file}" if a.startswith("--config=") else a for a in container_spec["args"]]

    plugin = chartkit.container(manifests.one("DaemonSet", "device-plugin"))
    settings, options, _ = deviceplugin_main.parse_args(with_local_config(plugin))
    assert settings == expected
    assert options.kubelet_dir == "/var/lib/kubelet/device-plugins"
    assert options.pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert options.http_port == plugin["ports"][0]["containerPort"]

    webhook = chartkit.container(manifests.one("Deployment", "webhook"))
    args = webhook_main.build_parser().parse_args(with_local_config(webhook))
    assert config.from_args(args, environ={}) == expected
    assert args.port == webhook["ports"][0]["containerPort"]
