"""The Helm chart, rendered by the real (pinned) helm: lint, schema validity for Kubernetes 1.29 to
1.35, and what a careful platform team checks: TLS, admission scoping, RBAC, pod security, mounts,
the shared configuration and the bin-packing scheduler profile."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import pathlib
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
    values = chartkit.COMBINATIONS[combination]
    if kube_version.startswith("1.29."):
        values = chartkit.merged(values, chartkit.UNCONFINED_NODE_WRITES)
    return chartkit.render(values, kube_version, chartkit.cluster_api_versions(values))


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
    values = chartkit.COMBINATIONS[combination]
    if chartkit.cluster_api_versions(values):  # helm lint takes no --api-versions: render as helm template may
        values = chartkit.merged(values, {"certManager": {"skipApiCheck": True}})
    values = chartkit.values_file(values, tmp_path)
    result = chartkit.run_helm("lint", "--strict", str(chartkit.CHART), "-f", str(values))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout


# A render for Kubernetes 1.30 to 1.35 differs only in the default kube-scheduler tag; 1.29 also
# leaves out the ValidatingAdmissionPolicy (and renders only with allowUnconfinedNodeWrites). So each
# combination is rendered for 1.29 and 1.35 and the default values for every version, and each
# render is validated against every version it stands for.
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


@pytest.mark.parametrize("combination", ["cert-manager", "cluster-issuer", "service-monitor", "everything"])
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
                ref = obj["spec"]["issuerRef"]
                if ref["kind"] == "Issuer":
                    assert manifests.named("Issuer", ref["name"])  # the chart's own
                else:
                    assert ref == {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
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


@pytest.mark.parametrize(
    ("values", "api_versions", "source"),
    [
        ({}, (), "generated"),
        ({}, ("cert-manager.io/v1",), "certManager"),
        ({"webhook": {"tls": {"source": "generated"}}}, ("cert-manager.io/v1",), "generated"),
        ({"webhook": {"tls": {"source": "certManager"}}}, ("cert-manager.io/v1",), "certManager"),
        ({"webhook": {"tls": {"source": "certManager"}}, "certManager": {"skipApiCheck": True}}, (), "certManager"),
    ],
    ids=[
        "auto-without-cert-manager",
        "auto-with-cert-manager",
        "generated-asked-for",
        "cert-manager-asked-for",
        "cert-manager-asked-for-without-api-check",
    ],
)
def test_tls_comes_from_cert_manager_wherever_the_cluster_serves_it_unless_told_otherwise(values, api_versions, source):
    manifests = chartkit.render(values, api_versions=api_versions)
    annotations = manifests.one("MutatingWebhookConfiguration")["metadata"].get("annotations", {})
    secret_name = chartkit.volume(manifests.one("Deployment", "webhook"), "tls")["secret"]["secretName"]
    if source == "certManager":
        assert manifests.named("Certificate", secret_name)
        assert annotations["cert-manager.io/inject-ca-from"] == f"{chartkit.NAMESPACE}/{secret_name}"
        assert not manifests.all("Secret")
    else:
        assert manifests.named("Secret", secret_name) and "Certificate" not in manifests.kinds()
        assert "cert-manager.io/inject-ca-from" not in annotations


CERT_MANAGER_MISSING = (
    "webhook.tls.source is certManager, but the cluster serves no cert-manager.io/v1 API (cert-manager is not "
    "installed): install cert-manager first (https://cert-manager.io/docs/installation/), or set "
    "webhook.tls.source=generated (the chart makes the certificate) or webhook.tls.source=secret (your own "
    "kubernetes.io/tls Secret). Rendering without a cluster (helm template) for one that has cert-manager: pass "
    "--api-versions cert-manager.io/v1, or set certManager.skipApiCheck=true"
)


@pytest.mark.parametrize("combination", ["cert-manager", "cluster-issuer", "everything"])
def test_cert_manager_asked_for_where_the_cluster_has_none_is_refused_with_what_to_do(combination, tmp_path):
    """Not helm's raw "no matches for kind Issuer" at apply time: the render stops and says what to do."""
    values = chartkit.COMBINATIONS[combination]
    result = chartkit.run_helm(*chartkit.template_args(values, tmp_path))  # no cert-manager.io/v1
    assert result.returncode != 0
    assert CERT_MANAGER_MISSING in " ".join(result.stderr.split())
    # The same values for a cluster that serves it render, as do renders told to skip the check.
    served = chartkit.template_args(values, tmp_path, f"--api-versions={chartkit.CERT_MANAGER_API}")
    assert chartkit.run_helm(*served).returncode == 0
    skipped = chartkit.merged(values, {"certManager": {"skipApiCheck": True}})
    assert chartkit.run_helm(*chartkit.template_args(skipped, tmp_path)).returncode == 0


@pytest.mark.parametrize("combination", ["cert-manager", "cluster-issuer", "tls-secret"])
def test_gitops_renders_without_cluster_access_are_the_same_every_time(combination, tmp_path):
    """Argo CD renders with `helm template` (no lookup): only a render that does not change keeps
    the caBundle and the served certificate in step between syncs."""
    outputs = set()
    values = chartkit.COMBINATIONS[combination]
    api_versions = [f"--api-versions={v}" for v in chartkit.cluster_api_versions(values)]
    for _ in range(2):
        args = chartkit.template_args(values, tmp_path, "--kube-version", chartkit.KUBE_VERSIONS[-1], *api_versions)
        result = chartkit.run_helm(*args)
        assert result.returncode == 0, result.stderr
        outputs.add(result.stdout)
    assert len(outputs) == 1
    # The generated default is the one that cannot be: a new CA every time (see the chart README).
    fresh = [chartkit.run_helm(*chartkit.template_args({}, tmp_path)).stdout for _ in range(2)]
    assert fresh[0] != fresh[1]


def test_an_existing_cluster_issuer_signs_the_serving_certificate_and_no_issuer_is_created():
    manifests = rendered("cluster-issuer")
    assert not manifests.all("Issuer")
    (certificate,) = manifests.all("Certificate")
    assert certificate["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    secret_name = chartkit.volume(manifests.one("Deployment", "webhook"), "tls")["secret"]["secretName"]
    assert certificate["spec"]["secretName"] == secret_name
    annotations = manifests.one("MutatingWebhookConfiguration")["metadata"]["annotations"]
    assert annotations["cert-manager.io/inject-ca-from"] == f"{chartkit.NAMESPACE}/{certificate['metadata']['name']}"


def test_an_existing_tls_secret_is_served_and_its_ca_is_the_bundle():
    manifests = rendered("tls-secret")
    assert not manifests.all("Secret") and "Certificate" not in manifests.kinds()
    deployment = manifests.one("Deployment", "webhook")
    assert chartkit.volume(deployment, "tls")["secret"]["secretName"] == "corp-webhook-tls"
    for hook in manifests.one("MutatingWebhookConfiguration")["webhooks"]:
        assert hook["clientConfig"]["caBundle"] == chartkit.sample_ca_bundle()
    monitored = chartkit.merged(chartkit.COMBINATIONS["tls-secret"], {"serviceMonitor": {"enabled": True}})
    service_monitor = chartkit.render(monitored)
    tls = service_monitor.one("ServiceMonitor", "webhook")["spec"]["endpoints"][0]["tlsConfig"]
    assert tls["ca"]["secret"]["name"] == "corp-webhook-tls"


@pytest.mark.parametrize(
    ("tls", "message"),
    [
        ({"source": "secret", "caBundle": "{ca_bundle}"}, "webhook.tls.secretName"),
        ({"source": "secret", "secretName": "s"}, "webhook.tls.caBundle"),
        ({"source": "secret", "secretName": "s", "caBundle": "bm90IGEgY2VydA=="}, "PEM certificate"),
    ],
    ids=["no-secret-name", "no-ca-bundle", "not-a-certificate"],
)
def test_an_incomplete_existing_secret_setting_is_refused(tls, message, tmp_path):
    result = chartkit.run_helm(*chartkit.template_args({"webhook": {"tls": tls}}, tmp_path))
    assert result.returncode != 0 and message in result.stderr


# --- admission scoping -----------------------------------------------------------------------------


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
    # (id, pod, sent without convertWholeGpus, sent with it (the default))
    ("kai-gpu-fraction", pod({"gpu-fraction": "0.5"}), True, True),
    ("kai-gpu-memory", pod({"gpu-memory": "2000"}), True, True),
    ("kai-num-devices", pod({"gpu-fraction-num-devices": "2", "gpu-fraction": "0.5"}), True, True),
    ("kai-container-name", pod({"gpu-fraction-container-name": "main"}), True, True),
    ("isolation-annotation", pod({"{prefix}/isolation": "mig"}), True, True),
    ("mig-or-share-annotation", pod({"{prefix}/mig-or-share": "true"}), True, True),
    ("no-annotations-at-all", pod(), False, False),
    ("unrelated-annotations", pod({"team": "ml"}), False, False),
    ("whole-gpu-limit", pod(limits={"nvidia.com/gpu": "1"}), False, True),
    ("whole-gpu-in-init-container", pod(init_limits={"nvidia.com/gpu": "1"}), False, True),
    ("cpu-only-limits", pod(limits={"cpu": "1"}), False, False),
    # other systems' names, converted or refused with advice (webhook/foreign.py)
    ("nvidia-mig-limit", pod(limits={"nvidia.com/mig-1g.10gb": "1"}), False, True),
    ("nvidia-mig-in-init-container", pod(init_limits={"nvidia.com/mig-3g.40gb": "1"}), False, True),
    ("hami-gpumem", pod(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}), False, True),
    ("hami-percentage-alone", pod(limits={"nvidia.com/gpumem-percentage": "50"}), False, True),
    ("hami-gpucores-alone", pod(limits={"nvidia.com/gpucores": "30"}), False, True),
    ("other-vendor-device", pod(limits={"amd.com/gpu": "1"}), False, False),
    # KAI's scheduler no longer runs: its name is rewritten on every pod that names it
    (
        "kai-scheduler-cpu-pod",
        {**pod(limits={"cpu": "1"}), "spec": {**pod()["spec"], "schedulerName": "kai-scheduler"}},
        True,
        True,
    ),
    ("other-scheduler", {**pod(), "spec": {**pod()["spec"], "schedulerName": "volcano"}}, False, False),
]


def converts_whole_gpus(combination: str) -> bool:
    return bool(chartkit.COMBINATIONS[combination].get("config", {}).get("convertWholeGpus", True))


@pytest.mark.parametrize("combination", ["defaults", "no-whole-gpu-conversion", "custom-prefix"])
@pytest.mark.parametrize(("case", "obj", "by_default", "when_converting"), MATCH_CASES, ids=[c[0] for c in MATCH_CASES])
def test_match_conditions_send_only_pods_that_ask_for_gpuslice(combination, case, obj, by_default, when_converting):
    prefix = prefix_of(combination)
    obj = json.loads(json.dumps(obj).replace("{prefix}", prefix))
    hook = webhook_configuration(rendered(combination))
    (condition,) = hook["matchConditions"]
    program = chartkit.cel_program(condition["expression"])
    expected = when_converting if converts_whole_gpus(combination) else by_default
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
    return all(
        bool(chartkit.cel_program(c["expression"]).evaluate(activation)) for c in hook.get("matchConditions", [])
    )


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
    ("mig-or-share-annotation", pod({"{prefix}/mig-or-share": "true"}), False),
    ("whole-gpu-limit", pod(limits={"nvidia.com/gpu": "1"}), False),
    # what the first entry made of a whole-GPU pod, as the API server shows it to the next entry
    ("converted-whole-gpu", pod({"{prefix}/decision": "{}"}, limits={"{prefix}/gpu-memory": "318"}), False),
    ("whole-gpu-in-init-container", pod(init_limits={"nvidia.com/gpu": "1"}), False),
    ("daemonset-owned", pod(limits={"cpu": "100m"}, owner="DaemonSet"), False),
    ("daemonset-owned-whole-gpu", pod(limits={"nvidia.com/gpu": "1"}, owner="DaemonSet"), False),
    ("daemonset-owned-gpu-fraction", pod({"gpu-fraction": "0.5"}, owner="DaemonSet"), False),
    ("nvidia-mig-limit", pod(limits={"nvidia.com/mig-1g.10gb": "1"}), False),
    ("hami-gpumem", pod(limits={"nvidia.com/gpumem": "3000"}), False),
    ("kai-scheduler-cpu-pod", {**pod(), "spec": {**pod()["spec"], "schedulerName": "kai-scheduler"}}, False),
]


@pytest.mark.parametrize("combination", ["defaults", "no-whole-gpu-conversion", "custom-prefix"])
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
    keys = contract.Contract(prefix=prefix).pod_annotations
    annotated = any(k in obj["metadata"].get("annotations", {}) for k in keys)
    nvidia = any(f'"nvidia.com/{n}' in json.dumps(obj["spec"]) for n in ("gpu", "mig-"))
    kai = obj["spec"].get("schedulerName") == "kai-scheduler"
    assert sent_for_gpuslice is (annotated or kai or (nvidia and converts_whole_gpus(combination)))


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
    assert conditions == {
        "no-gpuslice-annotations",
        "asks-for-no-gpu",
        "not-converted",
        "not-for-kai-scheduler",
        "not-a-daemonset-pod",
    }
    names = contract.Contract(prefix=prefix).pod_annotations
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
    names = contract.Contract(prefix=prefix_of(combination)).pod_annotations
    (condition,) = hook["matchConditions"]
    assert all(f"'{name}'" in condition["expression"] for name in names)  # the contract's names, every one
    assert hook["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
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
    assert {p["containerPort"] for p in webhook_container["ports"]} == {
        int(chartkit.arg_value(webhook_container, "--port"))
    }


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


def test_the_webhook_may_only_read_nodes_and_pods_the_controller_requeue_and_the_plugin_only_label_nodes():
    manifests = rendered("defaults")
    read_nodes = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}
    # The webhook writes nothing but its answers: pending and Failed pods are read for its promises.
    assert rules_of(manifests, "webhook") == [
        read_nodes,
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
    ]
    assert not [r for r in manifests.all("Role") if "webhook" in r["metadata"]["name"]]
    assert rules_of(manifests, "controller") == [
        # config.requeue (on by default): recreate refused converted pods, with an Event on each
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "delete"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]
    # ... and its journal: ConfigMaps in its own namespace only (controller/requeue_journal.py)
    journal = manifests.named("Role", "gpuslice-controller-requeue-journal")
    assert journal["metadata"]["namespace"] == chartkit.NAMESPACE
    assert journal["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "create", "delete"]}]
    without = chartkit.render(
        chartkit.merged(chartkit.COMBINATIONS["defaults"], {"config": {"requeue": {"enabled": False}}})
    )
    assert not [r for r in without.all("Role") if r["metadata"]["name"].endswith("-requeue-journal")]
    assert not without.all("Deployment", "controller")  # neither requeueing nor pacing: no controller
    assert rules_of(without, "webhook") == rules_of(manifests, "webhook")
    assert rules_of(manifests, "device-plugin") == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
        # its node's pods (list + watch, field-selected on spec.nodeName) for the CPU/memory headroom
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
    ]
    for component in ("webhook", "controller", "device-plugin"):
        binding = manifests.one("ClusterRoleBinding", component)
        (subject,) = binding["subjects"]
        service_account = manifests.one("ServiceAccount", component)
        assert subject["name"] == service_account["metadata"]["name"]
        workload = manifests.one("DaemonSet" if component == "device-plugin" else "Deployment", component)
        assert chartkit.pod_spec(workload)["serviceAccountName"] == subject["name"]


JOURNAL_CASES = [
    # (id, operation, ConfigMap after, before, allowed); an entry is named and labelled as
    # controller/requeue_journal.py names and labels it
    ("create-entry", "CREATE", "entry", None, True),
    ("delete-entry", "DELETE", None, "entry", True),
    ("create-other-name", "CREATE", "gpuslice-config", None, False),
    ("create-entry-name-unlabelled", "CREATE", "unlabelled", None, False),
    ("delete-chart-config", "DELETE", None, "gpuslice-config", False),
    ("delete-unlabelled-entry-name", "DELETE", None, "unlabelled", False),
    ("update-other-into-entry", "UPDATE", "entry", "gpuslice-config", False),
]


@pytest.mark.parametrize(
    ("case", "operation", "after", "before", "allowed"), JOURNAL_CASES, ids=[c[0] for c in JOURNAL_CASES]
)
def test_the_journal_policy_confines_the_controllers_configmap_writes_to_journal_entries(
    case, operation, after, before, allowed
):
    # The real API server enforces it in tests/e2e/test_real_burst.py; here its CEL alone, against
    # the names and label the journal itself writes.
    from gpuslice.controller import requeue_journal

    journal = requeue_journal.Journal(None, chartkit.NAMESPACE, config.Config().contract)  # type: ignore[arg-type]
    manifests = rendered("defaults")
    policy = manifests.named("ValidatingAdmissionPolicy", "gpuslice-controller-requeue-journal")
    binding = manifests.named("ValidatingAdmissionPolicyBinding", "gpuslice-controller-requeue-journal")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    config_maps = {
        "entry": {"metadata": {"name": journal.entry_name("0b0e-uid"), "labels": {journal.label: "v1"}}},
        "unlabelled": {"metadata": {"name": journal.entry_name("0b0e-uid")}},
        "gpuslice-config": {"metadata": {"name": "gpuslice-config", "labels": {"app": "gpuslice"}}},
    }

    def request(username: str) -> dict[str, Any]:
        return {
            "request": {"userInfo": {"username": username}, "operation": operation},
            "object": config_maps[after] if after else None,
            "oldObject": config_maps[before] if before else None,
        }

    account = manifests.one("ServiceAccount", "controller")["metadata"]["name"]
    matched, failed = chartkit.evaluate_policy(policy, request(f"system:serviceaccount:{chartkit.NAMESPACE}:{account}"))
    assert matched and (not failed) is allowed, failed
    assert chartkit.evaluate_policy(policy, request("system:serviceaccount:kube-system:other")) == (False, [])


def test_the_journal_policy_comes_with_the_requeuer_where_the_cluster_has_policies():
    def names(values: dict[str, Any], kube_version: str = chartkit.KUBE_VERSIONS[-1]) -> list[str]:
        manifests = chartkit.render(chartkit.merged(chartkit.COMBINATIONS["defaults"], values), kube_version)
        return [p["metadata"]["name"] for p in manifests.all("ValidatingAdmissionPolicy")]

    assert "gpuslice-controller-requeue-journal" in names({})
    assert "gpuslice-controller-requeue-journal" not in names({"config": {"requeue": {"enabled": False}}})
    unconfined = {"devicePlugin": {"nodePatchPolicy": {"allowUnconfinedNodeWrites": True}}}
    assert "gpuslice-controller-requeue-journal" not in names(unconfined, "1.29.0")  # no v1 policies there


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
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [election["resourceName"]],
            "verbs": ["get", "update"],
        }
    ]


# --- the device plugin's node-patch policy -----------------------------------------------------------


def admission_request(username: str, node: str, old: dict[str, Any], new: dict[str, Any], node_claim: str | None):
    extra = {"authentication.kubernetes.io/node-name": [node_claim]} if node_claim else {}
    return {
        "request": {"userInfo": {"username": username, "extra": extra}},
        "object": {"metadata": {"name": node, **new.get("metadata", {})}, "spec": new.get("spec", {})},
        "oldObject": {"metadata": {"name": node, **old.get("metadata", {})}, "spec": old.get("spec", {})},
    }


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
    ("adds-an-owner-reference", {"{prefix}/gpu.free-units": "300"}, {}, "gpu-1", False),
    ("adds-a-finalizer", {"{prefix}/gpu.free-units": "300"}, {}, "gpu-1", False),
    ("removes-a-finalizer", {}, {}, "gpu-1", False),
]
# Metadata besides labels that a case changes: (before, after).
POLICY_METADATA = {
    "adds-an-owner-reference": (
        {},
        {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "doomed", "uid": "1"}]},
    ),
    "adds-a-finalizer": ({}, {"finalizers": ["example.com/keep"]}),
    "removes-a-finalizer": ({"finalizers": ["example.com/keep"]}, {}),
}


@pytest.mark.parametrize("combination", ["defaults", "custom-prefix"])
@pytest.mark.parametrize(
    ("case", "changes", "spec", "claim", "allowed"), POLICY_CASES, ids=[c[0] for c in POLICY_CASES]
)
def test_node_patch_policy_confines_the_plugin_to_its_own_nodes_prefixed_labels(
    combination, case, changes, spec, claim, allowed
):
    prefix = prefix_of(combination)
    manifests = rendered(combination)
    policy = manifests.one("ValidatingAdmissionPolicy", "device-plugin")
    binding = manifests.one("ValidatingAdmissionPolicyBinding", "device-plugin")
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
    old_metadata, new_metadata = POLICY_METADATA.get(case, ({}, {}))
    request = admission_request(
        username,
        "gpu-1",
        {"metadata": {"labels": old_labels, **old_metadata}},
        {"metadata": {"labels": new_labels, **new_metadata}, "spec": spec},
        claim,
    )
    matched, failed = chartkit.evaluate_policy(policy, request)
    assert matched
    assert (not failed) is allowed, failed
    # Anybody else's writes are not this policy's business.
    other = admission_request(
        "system:node:gpu-1", "gpu-1", {"metadata": {"labels": old_labels}}, {"metadata": {"labels": new_labels}}, claim
    )
    assert chartkit.evaluate_policy(policy, other) == (False, [])


@pytest.mark.parametrize(("kube_version", "expected"), [("1.29.0", False), ("1.30.0", True), ("1.35.0", True)])
def test_node_patch_policy_is_installed_where_the_api_and_the_node_claim_exist(kube_version, expected):
    manifests = chartkit.render(chartkit.UNCONFINED_NODE_WRITES, kube_version)
    assert bool(manifests.all("ValidatingAdmissionPolicy", "device-plugin")) is expected
    assert bool(manifests.all("ValidatingAdmissionPolicyBinding", "device-plugin")) is expected


@pytest.mark.parametrize(
    ("kube_version", "values", "reason"),
    [
        ("1.29.0", {}, "no ValidatingAdmissionPolicy v1"),
        ("1.35.0", {"devicePlugin": {"nodePatchPolicy": {"enabled": False}}}, "nodePatchPolicy.enabled is false"),
    ],
    ids=["kubernetes-1.29", "policy-disabled"],
)
def test_unconfined_node_writes_are_refused_unless_accepted(kube_version, values, reason, tmp_path):
    refused = chartkit.run_helm(*chartkit.template_args(values, tmp_path, "--kube-version", kube_version))
    assert refused.returncode != 0
    assert reason in refused.stderr and "allowUnconfinedNodeWrites=true" in refused.stderr
    assert "patch every node" in refused.stderr

    accepted = chartkit.merged(values, chartkit.UNCONFINED_NODE_WRITES)
    manifests = chartkit.render(accepted, kube_version)
    assert manifests.all("ValidatingAdmissionPolicy", "device-plugin") == []
    assert manifests.one("DaemonSet", "device-plugin")


@pytest.mark.parametrize(
    ("kube_version", "values"),
    [("1.29.0", {}), ("1.35.0", {"devicePlugin": {"nodePatchPolicy": {"enabled": False}}})],
    ids=["kubernetes-1.29", "policy-disabled"],
)
def test_the_notes_warn_loudly_when_node_writes_are_unconfined(kube_version, values, tmp_path):
    accepted = chartkit.merged(values, chartkit.UNCONFINED_NODE_WRITES)
    notes = install_notes(accepted, tmp_path, kube_version)
    assert "WARNING: NODE WRITES ARE NOT CONFINED" in notes and "EVERY node" in notes
    # The warning is only there when it is true.
    assert "NOT CONFINED" not in install_notes(chartkit.UNCONFINED_NODE_WRITES, tmp_path, "1.30.0")
    no_plugin = chartkit.merged(accepted, {"devicePlugin": {"enabled": False}})
    assert "NOT CONFINED" not in install_notes(no_plugin, tmp_path, kube_version)


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
    manifests = chartkit.render(
        {"devicePlugin": {"runtimeClassName": "", "driverRoot": "/run/nvidia/driver", "privileged": True}}
    )
    daemonset = manifests.one("DaemonSet", "device-plugin")
    context = chartkit.container(daemonset)["securityContext"]
    # The API refuses privileged together with allowPrivilegeEscalation false.
    assert context == {"privileged": True, "readOnlyRootFilesystem": True}
    assert chartkit.schema_errors(daemonset, chartkit.KUBE_VERSIONS[-1]) == []


def test_security_contexts_are_values_merged_over_the_locked_down_defaults():
    manifests = chartkit.render(
        {
            "webhook": {"podSecurityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": None}},
            "devicePlugin": {"securityContext": {"seLinuxOptions": {"type": "spc_t"}}},
            "scheduler": {
                "enabled": True,
                "podSecurityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "s.json"}},
            },
        }
    )
    webhook_pod = chartkit.pod_spec(manifests.one("Deployment", "webhook"))["securityContext"]
    expected = {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000}
    expected["seccompProfile"] = {"type": "RuntimeDefault"}
    assert webhook_pod == expected  # fsGroup removed by null, the rest kept
    plugin = chartkit.container(manifests.one("DaemonSet", "device-plugin"))["securityContext"]
    assert plugin["seLinuxOptions"] == {"type": "spc_t"} and plugin["capabilities"] == {"drop": ["ALL"]}
    scheduler_pod = chartkit.pod_spec(manifests.one("Deployment", "scheduler"))["securityContext"]
    assert scheduler_pod["seccompProfile"] == {"type": "Localhost", "localhostProfile": "s.json"}
    assert scheduler_pod["runAsNonRoot"] is True
    for obj in manifests:
        if obj["kind"] not in CRD_KINDS:
            assert chartkit.schema_errors(obj, chartkit.KUBE_VERSIONS[-1]) == []


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
    spread = {c["topologyKey"]: c for c in chartkit.pod_spec(deployment)["topologySpreadConstraints"]}
    # Strict across nodes (as required anti-affinity would be where there are enough nodes), yet a
    # one-node cluster still runs both replicas: only nodes the pods may use are counted as domains.
    hostname = spread["kubernetes.io/hostname"]
    assert hostname["whenUnsatisfiable"] == "DoNotSchedule" and hostname["maxSkew"] == 1
    assert hostname["nodeTaintsPolicy"] == "Honor"  # tainted GPU nodes and cordoned nodes do not count
    assert hostname.get("nodeAffinityPolicy", "Honor") == "Honor"
    assert hostname["matchLabelKeys"] == ["pod-template-hash"]  # each rollout spread on its own
    assert spread["topology.kubernetes.io/zone"]["whenUnsatisfiable"] == "ScheduleAnyway"
    for term in spread.values():
        assert term["labelSelector"]["matchLabels"].items() <= pod_labels.items()
    assert "affinity" not in chartkit.pod_spec(deployment)  # nothing required that a small cluster cannot meet
    budget = manifests.one("PodDisruptionBudget", "webhook")
    assert budget["spec"] == {"maxUnavailable": 1, "selector": budget["spec"]["selector"]}
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    service = manifests.one("Service", "webhook")
    assert service["spec"]["selector"].items() <= pod_labels.items()


def allowed_disruptions(budget: dict[str, Any], healthy: int) -> int:
    """What the disruption controller allows with `healthy` pods of as many expected (no eviction
    at 0: a drain waits for ever)."""
    spec = budget["spec"]

    def pods(value: int | str) -> int:
        if isinstance(value, str) and value.endswith("%"):
            return -(-int(value[:-1]) * healthy // 100)  # rounded up, as the controller does
        return int(value)

    if "maxUnavailable" in spec:
        return max(0, healthy - (healthy - pods(spec["maxUnavailable"])))
    return max(0, healthy - pods(spec["minAvailable"]))


@pytest.mark.parametrize("replicas", [1, 2, 3])
@pytest.mark.parametrize(
    "budget_values", [{}, {"minAvailable": "50%"}, {"minAvailable": 1}], ids=["default", "half", "one"]
)
def test_the_webhook_budget_never_blocks_a_drain(replicas, budget_values, tmp_path):
    values = {"webhook": {"replicas": replicas, "podDisruptionBudget": budget_values}}
    result = chartkit.run_helm(*chartkit.template_args(values, tmp_path))
    minimum = budget_values.get("minAvailable", 0)
    required = -(-int(minimum[:-1]) * replicas // 100) if isinstance(minimum, str) else minimum
    if required >= replicas:  # e.g. minAvailable 1 of 1 replica: no eviction would ever be allowed
        assert result.returncode != 0 and "would block every node drain" in result.stderr
        return
    assert result.returncode == 0, result.stderr
    budget = chartkit.parse(result.stdout).one("PodDisruptionBudget", "webhook")
    assert allowed_disruptions(budget, replicas) >= 1


@pytest.mark.parametrize(
    "budget_values",
    [{"minAvailable": 2}, {"minAvailable": "100%"}, {"minAvailable": "60%"}, {"maxUnavailable": 0}],
    ids=["min-2-of-2", "min-100-percent", "min-60-percent-of-2", "max-unavailable-0"],
)
def test_a_budget_that_would_block_every_drain_is_refused(budget_values, tmp_path):
    values = {"webhook": {"replicas": 2, "podDisruptionBudget": budget_values}}
    result = chartkit.run_helm(*chartkit.template_args(values, tmp_path))
    assert result.returncode != 0
    assert "block every node drain" in result.stderr or "maxUnavailable" in result.stderr


def test_one_webhook_replica_is_warned_about_in_the_notes(tmp_path):
    notes = install_notes({"webhook": {"replicas": 1}}, tmp_path)
    assert "webhook.replicas is 1" in notes and "refused" in notes
    assert "webhook.replicas is 1" not in install_notes({}, tmp_path)


# --- the webhook's NetworkPolicy ------------------------------------------------------------------


def test_network_policy_admits_only_the_api_server_and_extra_rules_to_the_webhook_port():
    manifests = rendered("network-policy")
    policy = manifests.one("NetworkPolicy", "webhook")
    deployment = manifests.one("Deployment", "webhook")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress to the API server stays open
    api_server, *extra = policy["spec"]["ingress"]
    values = chartkit.COMBINATIONS["network-policy"]["webhook"]["networkPolicy"]
    assert api_server["from"] == values["apiServer"]
    port = chartkit.container(deployment)["ports"][0]["containerPort"]
    assert api_server["ports"] == [{"port": port, "protocol": "TCP"}]
    assert extra == values["extraIngress"]
    # The Service's target port is that port: the policy covers the path the API server takes.
    service = manifests.one("Service", "webhook")
    assert service["spec"]["ports"][0]["targetPort"] == chartkit.container(deployment)["ports"][0]["name"]


def test_no_network_policy_unless_enabled_and_none_without_api_server_peers(tmp_path):
    assert not rendered("defaults").all("NetworkPolicy")
    result = chartkit.run_helm(*chartkit.template_args({"webhook": {"networkPolicy": {"enabled": True}}}, tmp_path))
    assert result.returncode != 0
    assert "webhook.networkPolicy.apiServer" in result.stderr


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
def test_daemonset_mounts_only_the_host_paths_the_plugin_opens_and_writes_only_its_socket_directory(
    combination, tmp_path
):
    """With cdi-cri and MPS the plugin only names CDI devices and the pipe directory in its Allocate
    answers, so neither /var/run/cdi (CDI specs can carry host hooks) nor the pipe is mounted."""
    manifests = rendered(combination)
    settings = shared_config(manifests, tmp_path)
    daemonset = manifests.one("DaemonSet", "device-plugin")
    host_paths = {v["hostPath"]["path"] for v in chartkit.pod_spec(daemonset)["volumes"] if "hostPath" in v}
    expected = {"/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources"}
    expected |= {"/run/nvidia/driver"} if combination == "driver-root" else set()
    expected |= {"/proc"} if settings.monitor.enabled else set()  # read-only: GPU processes' cgroups
    assert host_paths == expected
    assert "/var/run/cdi" not in host_paths and settings.mps.pipe_directory not in host_paths
    plugin = chartkit.container(daemonset)
    host_volumes = {v["name"] for v in chartkit.pod_spec(daemonset)["volumes"] if "hostPath" in v}
    writable = {m["mountPath"] for m in plugin["volumeMounts"] if m["name"] in host_volumes and not m.get("readOnly")}
    assert writable == {chartkit.arg_value(plugin, "--kubelet-dir")}  # where it creates its socket


def test_only_the_dra_plugin_which_writes_cdi_specs_mounts_the_cdi_directory():
    values = {"mode": "both", "dra": {"consumableCapacityGateEnabled": True, "cdiSpecDir": "/etc/cdi"}}
    values["config"] = {"deviceListStrategy": "cdi-cri", "mps": {"enabled": True}}
    manifests = chartkit.render(values)
    mounting = {}
    for daemonset in manifests.all("DaemonSet"):
        volumes = chartkit.pod_spec(daemonset)["volumes"]
        host_paths = {v["name"]: v["hostPath"]["path"] for v in volumes if "hostPath" in v}
        for mount in chartkit.container(daemonset)["volumeMounts"]:
            if host_paths.get(mount["name"]) == "/etc/cdi":
                mounting[daemonset["metadata"]["labels"]["app.kubernetes.io/component"]] = mount.get("readOnly", False)
    assert mounting == {"dra-plugin": False}  # read-write, and nowhere else


def test_mps_and_cdi_reach_workloads_through_allocate_not_through_the_plugin_pod(tmp_path):
    """What the chart no longer mounts is still handed to workloads: the plugin names the host pipe
    directory and CDI devices in its Allocate answers."""
    from gpuslice.node import allocation, response

    manifests = rendered("everything")
    settings = shared_config(manifests, tmp_path)
    grant = allocation.MemoryGrant(gpu_uuids=("GPU-0",), units=160, memory_mib=40960, fraction=0.5)
    answer = response.memory_response(grant, settings)
    assert settings.mps.pipe_directory in [m.host_path for m in answer.mounts]
    assert [d.name for d in answer.cdi_devices] == [f"{settings.cdi_kind}=GPU-0"]


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


def node_matches(spec: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a node with `labels` satisfies a pod spec's nodeSelector and required node affinity."""
    if any(labels.get(k) != v for k, v in spec.get("nodeSelector", {}).items()):
        return False
    required = spec.get("affinity", {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True

    def holds(expression: dict[str, Any]) -> bool:
        assert expression["operator"] in ("In", "NotIn"), expression  # the only operators the chart uses
        return (labels.get(expression["key"]) in expression["values"]) is (expression["operator"] == "In")

    return any(all(holds(e) for e in term["matchExpressions"]) for term in required["nodeSelectorTerms"])


NODE_CASES = [
    # (id, node labels, runs with optInLabel, with gpuFeatureLabels (and nodeSelector node-pool=gpu))
    ("opted-in", {"{prefix}/enabled": "true", "node-pool": "gpu"}, True, False),
    ("gfd-labelled", {"nvidia.com/gpu.present": "true", "node-pool": "gpu"}, False, True),
    ("nfd-labelled", {"feature.node.kubernetes.io/pci-10de.present": "true", "node-pool": "gpu"}, False, True),
    ("gfd-labelled-other-pool", {"nvidia.com/gpu.present": "true", "node-pool": "cpu"}, False, False),
    ("gfd-says-no-gpu", {"nvidia.com/gpu.present": "false", "node-pool": "gpu"}, False, False),
    ("plain-node", {"node-pool": "gpu"}, False, False),
]


@pytest.mark.parametrize(("case", "labels", "opt_in", "feature_labels"), NODE_CASES, ids=[c[0] for c in NODE_CASES])
def test_node_selection_by_opt_in_label_or_by_gpu_feature_discovery_labels(case, labels, opt_in, feature_labels):
    labels = {k.replace("{prefix}", contract.DEFAULT_PREFIX): v for k, v in labels.items()}
    by_label = chartkit.pod_spec(rendered("defaults").one("DaemonSet", "device-plugin"))
    by_features = chartkit.pod_spec(rendered("gpu-feature-labels").one("DaemonSet", "device-plugin"))
    assert node_matches(by_label, labels) is opt_in
    assert node_matches(by_features, labels) is feature_labels
    assert contract.Contract().label_node_enabled not in by_features["nodeSelector"]


@pytest.mark.parametrize("selection", ["optInLabel", "gpuFeatureLabels", "none"])
def test_the_mps_control_daemon_runs_on_exactly_the_plugins_nodes(selection):
    values = {"config": {"mps": {"enabled": True}}, "devicePlugin": {"nodeSelection": selection}}
    manifests = chartkit.render(values)
    plugin = chartkit.pod_spec(manifests.one("DaemonSet", "device-plugin"))
    daemon = chartkit.pod_spec(manifests.one("DaemonSet", "mps-control-daemon"))
    for field in ("nodeSelector", "affinity", "tolerations"):
        assert daemon.get(field) == plugin.get(field), field


def test_in_mode_both_gpu_feature_labels_leave_the_dra_nodes_to_the_dra_plugin():
    values = {
        "mode": "both",
        "dra": {"consumableCapacityGateEnabled": True},
        "devicePlugin": {"nodeSelection": "gpuFeatureLabels"},
    }
    manifests = chartkit.render(values)
    plugin = chartkit.pod_spec(manifests.one("DaemonSet", "device-plugin"))
    dra = chartkit.pod_spec(manifests.one("DaemonSet", "dra-plugin"))
    prefix = contract.DEFAULT_PREFIX
    gpu_node = {"nvidia.com/gpu.present": "true"}
    dra_node = {**gpu_node, f"{prefix}/dra": "true"}
    assert node_matches(plugin, gpu_node) and not node_matches(plugin, dra_node)
    assert node_matches(dra, dra_node) and not node_matches(dra, gpu_node)


def test_gpu_feature_labels_refuse_a_required_node_affinity_of_your_own(tmp_path):
    own = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "Exists"}]}]}
    required = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": own}}
    values = {"devicePlugin": {"nodeSelection": "gpuFeatureLabels", "affinity": required}}
    result = chartkit.run_helm(*chartkit.template_args(values, tmp_path))
    assert result.returncode != 0 and "devicePlugin.nodeSelector" in result.stderr
    # Preferences and pod affinity are kept beside the chart's required terms.
    preferred = [{"weight": 1, "preference": {"matchExpressions": [{"key": "b", "operator": "Exists"}]}}]
    values["devicePlugin"]["affinity"] = {
        "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}
    }
    affinity = chartkit.pod_spec(chartkit.render(values).one("DaemonSet", "device-plugin"))["affinity"]
    assert affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == preferred
    assert len(affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]) == 2


def test_node_selection_none_leaves_only_your_selector():
    values = {"devicePlugin": {"nodeSelection": "none", "nodeSelector": {"gpu": "yes"}}}
    spec = chartkit.pod_spec(chartkit.render(values).one("DaemonSet", "device-plugin"))
    assert spec["nodeSelector"] == {"gpu": "yes"} and "affinity" not in spec


@pytest.mark.parametrize("combination", ["gpu-feature-labels", "everything"])
def test_image_pull_secrets_reach_every_pod_in_the_pod_spec_form(combination):
    manifests = rendered(combination)
    given = chartkit.COMBINATIONS[combination]["imagePullSecrets"]
    expected = [{"name": s if isinstance(s, str) else s["name"]} for s in given]
    workloads = manifests.all("Deployment") + manifests.all("DaemonSet")
    assert {w["metadata"]["labels"]["app.kubernetes.io/component"] for w in workloads} >= {"webhook", "device-plugin"}
    for workload in workloads:
        assert chartkit.pod_spec(workload)["imagePullSecrets"] == expected, workload["metadata"]["name"]
    assert all("imagePullSecrets" not in chartkit.pod_spec(w) for w in rendered("defaults").all("Deployment"))


def test_driver_root_mode_mounts_the_driver_read_only_and_drops_the_runtime_class():
    daemonset = rendered("driver-root").one("DaemonSet", "device-plugin")
    assert "runtimeClassName" not in chartkit.pod_spec(daemonset)
    plugin = chartkit.container(daemonset)
    assert chartkit.mount_for(plugin, "/driver-root")["readOnly"] is True
    assert host_path_for(daemonset, "/driver-root") == {"path": "/run/nvidia/driver", "type": "Directory"}
    library_path = next(e["value"] for e in plugin["env"] if e["name"] == "LD_LIBRARY_PATH")
    assert all(part.startswith("/driver-root/") for part in library_path.split(":"))


# --- the image -------------------------------------------------------------------------------------

APP_VERSION = yaml.safe_load((chartkit.CHART / "Chart.yaml").read_text())["appVersion"]
IMAGE_MISSING = (
    "image.repository is not set: gpuslice publishes no image. Build it from the Dockerfile at the top of the "
    "gpuslice repository and push it to a registry your nodes pull from: "
    f"`make image IMAGE=<registry>/gpuslice:{APP_VERSION} && docker push <registry>/gpuslice:{APP_VERSION}` "
    f"(or podman), then install with `--set image.repository=<registry>/gpuslice --set image.tag={APP_VERSION}`, "
    "or pin what you pushed with `--set image.digest=sha256:<digest>` instead of the tag"
)
DIGEST = "sha256:" + "0123456789abcdef" * 4


def gpuslice_images(manifests: chartkit.Manifests) -> set[str]:
    """The image of every container the chart runs from the gpuslice image (all but kube-scheduler)."""
    images = set()
    for workload in (*manifests.all("Deployment"), *manifests.all("DaemonSet")):
        spec = chartkit.pod_spec(workload)
        for container_spec in (*spec.get("initContainers", []), *spec["containers"]):
            if not container_spec["image"].startswith("registry.k8s.io/kube-scheduler:"):
                images.add(container_spec["image"])
    return images


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"image": {"repository": ""}},
        {"image": {"tag": "0.1.0"}},
        {"image": {"digest": DIGEST}},
        {"devicePlugin": {"enabled": False}},
        {"mode": "dra"},
    ],
    ids=["defaults", "empty-repository", "tag-only", "digest-only", "webhook-only", "dra"],
)
def test_without_an_image_of_your_own_the_chart_refuses_to_render_and_says_how_to_build_one(values, tmp_path):
    """gpuslice publishes no image, and its plugin runs as root with kubelet's directories mounted:
    no default image of some public namespace may install without a word."""
    args = chartkit.template_args(values, tmp_path, "--kube-version", "1.36.0", test_image=False)
    result = chartkit.run_helm(*args)
    assert result.returncode != 0
    assert IMAGE_MISSING in " ".join(result.stderr.split())


def test_the_chart_has_no_default_image():
    defaults = yaml.safe_load((chartkit.CHART / "values.yaml").read_text())
    assert defaults["image"]["repository"] == ""


@pytest.mark.parametrize(
    ("image", "reference"),
    [
        ({"repository": "registry.example.com/gpu/gpuslice"}, f"registry.example.com/gpu/gpuslice:{APP_VERSION}"),
        (
            {"repository": "registry.example.com/gpuslice", "tag": "0.1.0-rc1"},
            "registry.example.com/gpuslice:0.1.0-rc1",
        ),
        ({"repository": "registry.example.com/gpuslice", "digest": DIGEST}, f"registry.example.com/gpuslice@{DIGEST}"),
        (
            {"repository": "registry.example.com/gpuslice", "tag": "0.1.0", "digest": DIGEST},
            f"registry.example.com/gpuslice@{DIGEST}",
        ),
    ],
    ids=["repository", "repository-and-tag", "repository-and-digest", "digest-wins-over-tag"],
)
def test_every_gpuslice_container_runs_the_image_you_named(image, reference):
    values = chartkit.merged(chartkit.COMBINATIONS["everything"], {"image": image})
    manifests = chartkit.render(values, api_versions=chartkit.cluster_api_versions(values))
    assert gpuslice_images(manifests) == {reference}
    components = {w["metadata"]["labels"]["app.kubernetes.io/component"] for w in manifests.all("DaemonSet")}
    assert {"device-plugin", "mps-control-daemon"} <= components  # the root ones among them
    dra = chartkit.render(chartkit.merged({"mode": "dra"}, {"image": image}), "1.36.0")
    assert gpuslice_images(dra) == {reference}


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
    assert settings.convert_whole_gpus is values.get("config", {}).get("convertWholeGpus", True)
    scheduler_on = values.get("scheduler", {}).get("enabled", False)
    assert settings.scheduler_name == ("gpuslice-binpack" if scheduler_on else "")


def test_values_config_covers_exactly_the_configuration_schema(tmp_path):
    values = yaml.safe_load((chartkit.CHART / "values.yaml").read_text())

    def paths(mapping: dict[str, Any], prefix: str = "") -> set[str]:
        out: set[str] = set()
        for key, value in mapping.items():
            out |= paths(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key}
        return out

    assert paths(values["config"]) == {field.path for field in config.FIELDS}
    # Keys the chart fills in itself when empty (the controller's Lease: "<fullname>-controller",
    # which for the release "gpuslice" is the schema's default too).
    overrides = dict(_flatten(values["config"]))
    assert overrides.pop("controller.leaseName") == ""
    assert config.load(overrides=overrides, environ={}) == config.Config()
    assert shared_config(rendered("defaults"), tmp_path).pacing == config.PacingConfig()


def _flatten(mapping: dict[str, Any], prefix: str = ""):
    for key, value in mapping.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield prefix + key, value


def test_values_schema_refuses_unknown_keys_in_every_section_it_describes():
    """additionalProperties false wherever the chart knows every key; free-form only where a value
    is a Kubernetes object passed through (affinity, resources, security contexts, ...)."""
    schema = json.loads((chartkit.CHART / "values.schema.json").read_text())
    values = yaml.safe_load((chartkit.CHART / "values.yaml").read_text())
    assert schema["additionalProperties"] is False
    assert set(values) <= set(schema["properties"])

    def sections(node: dict[str, Any], path: str = ""):
        for key, prop in node.get("properties", {}).items():
            if "properties" in prop:
                yield f"{path}{key}", prop
                yield from sections(prop, f"{path}{key}.")

    open_sections = [path for path, prop in sections(schema) if prop.get("additionalProperties") is not False]
    assert open_sections == []


def test_a_parent_chart_can_pass_global_values(tmp_path):
    result = chartkit.run_helm(*chartkit.template_args({"global": {"imageRegistry": "mirror.example.com"}}, tmp_path))
    assert result.returncode == 0, result.stderr


def test_values_schema_checks_config_as_the_components_would():
    schema = json.loads((chartkit.CHART / "values.schema.json").read_text())
    kinds = {bool: "boolean", int: "integer", float: "number", str: "string", tuple: "array"}

    def leaves(node: dict[str, Any], prefix: str = ""):
        for key, prop in node["properties"].items():
            assert node["additionalProperties"] is False, prefix
            if prefix + key == config.NODE_CONFIGS_KEY:
                continue  # a map of partial configurations, checked below
            if prop["type"] == "object":
                yield from leaves(prop, f"{prefix}{key}.")
            else:
                yield prefix + key, prop

    config_leaves = dict(leaves(schema["properties"]["config"]))
    assert {path: prop["type"] for path, prop in config_leaves.items()} == {
        f.path: kinds[f.kind] for f in config.FIELDS
    }
    # a node configuration's keys are checked exactly as the same keys of config
    entry = schema["properties"]["config"]["properties"][config.NODE_CONFIGS_KEY]["additionalProperties"]
    assert dict(leaves(entry)) == {path: config_leaves[path] for path in config.PER_NODE_KEYS}


def test_node_configs_reach_the_config_map_and_every_node_reads_them(tmp_path):
    entries = {
        "mig-single": {"migStrategy": "single"},
        "cdi": {"deviceListStrategy": "cdi-cri", "health": {"eventTimeoutMs": 100}},
    }
    manifests = chartkit.render({"config": {"nodeConfigs": entries}})
    document = yaml.safe_load(manifests.one("ConfigMap", "config")["data"]["config.yaml"])
    assert document["nodeConfigs"] == entries
    path = tmp_path / "config.yaml"
    path.write_text(manifests.one("ConfigMap", "config")["data"]["config.yaml"])
    assert config.load(path, environ={}).node_config_names == ("cdi", "mig-single")
    settings = config.load(path, environ={}, node_config="cdi")
    assert (settings.device_list_strategy, settings.health.event_timeout_ms) == ("cdi-cri", 100)
    plain = rendered("defaults").one("DaemonSet", "device-plugin")["spec"]["template"]["metadata"]["annotations"]
    with_entries = manifests.one("DaemonSet", "device-plugin")["spec"]["template"]["metadata"]["annotations"]
    assert plain["checksum/config"] != with_entries["checksum/config"]  # a new entry restarts the plugins


def test_webhook_tolerations_and_connection_bounds_reach_the_shared_config(tmp_path):
    tolerations = [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]
    values = {"config": {"convertedPodTolerations": tolerations, "webhook": {"idleTimeoutSeconds": 30}}}
    settings = shared_config(chartkit.render(values), tmp_path)
    assert settings.converted_pod_tolerations == tuple(tolerations)
    assert settings.webhook.idle_timeout_seconds == 30 and settings.webhook.max_connections == 1000
    defaults = shared_config(rendered("defaults"), tmp_path)
    assert defaults.converted_pod_tolerations == config.DEFAULT_CONVERTED_POD_TOLERATIONS


def test_config_changes_roll_the_pods():
    plain = rendered("defaults").one("DaemonSet", "device-plugin")
    changed = rendered("mps").one("DaemonSet", "device-plugin")
    annotations = [w["spec"]["template"]["metadata"]["annotations"] for w in (plain, changed)]
    assert annotations[0]["checksum/config"] != annotations[1]["checksum/config"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"config": {"resourcePrefix": "Not_A_Prefix"}}, "resourcePrefix"),
        ({"config": {"resourcePrefix": "gpu.kubernetes.io"}}, "resourcePrefix"),
        ({"config": {"memoryUnitMiB": 0}}, "memoryUnitMiB"),
        ({"config": {"deviceListStrategy": "volume-mounts"}}, "deviceListStrategy"),
        ({"config": {"migStrategy": "all"}}, "migStrategy"),
        ({"config": {"nodeConfigs": {"a": {"migStrategie": "single"}}}}, "migStrategie"),
        ({"config": {"nodeConfigs": {"a": {"migStrategy": "all"}}}}, "migStrategy"),
        ({"config": {"nodeConfigs": {"a": {"memoryUnitMiB": 512}}}}, "memoryUnitMiB"),
        ({"config": {"nodeConfigs": {"-a": {}}}}, "-a"),
        ({"config": {"mps": {"enable": True}}}, "enable"),
        ({"config": {"memoryUnitMb": 512}}, "memoryUnitMb"),
        ({"scheduler": {"weights": {"gpuMemory": 500}}}, "gpuMemory"),
        ({"webhook": {"timeoutSeconds": 60}}, "timeoutSeconds"),
        ({"scheduler": {"enabled": True}, "config": {"schedulerName": "other"}}, "config.schedulerName"),
        ({"imagePullSecret": [{"name": "x"}]}, "imagePullSecret"),
        ({"webhooks": {"replicas": 3}}, "webhooks"),
        ({"imagePullSecrets": [{"nmae": "x"}]}, "imagePullSecrets"),
        ({"devicePlugin": {"nodeSelection": "gfd"}}, "nodeSelection"),
        ({"webhook": {"tls": {"source": "vault"}}}, "source"),
        ({"certManager": {"enabled": True}}, "webhook.tls.source"),
        ({"webhook": {"runAsUser": 1000}}, "webhook.podSecurityContext.runAsUser"),
        ({"devicePlugin": {"requireOptInLabel": False}}, "devicePlugin.nodeSelection"),
        ({"devicePlugin": {"cdiSpecDir": "/etc/cdi"}}, "dra.cdiSpecDir"),
        ({"config": {"convertedPodTolerations": [{"key": "a", "operator": "Like"}]}}, "operator"),
        ({"config": {"convertedPodTolerations": [{"key": "a", "effect": "NoSchedule", "sec": 1}]}}, "sec"),
        ({"config": {"webhook": {"maxConnections": 0}}}, "maxConnections"),
    ],
    ids=[
        "bad-prefix",
        "reserved-prefix",
        "zero-unit",
        "unknown-strategy",
        "unknown-mig-strategy",
        "node-config-typo",
        "node-config-bad-value",
        "node-config-cluster-wide-key",
        "node-config-bad-name",
        "misspelt-nested-key",
        "misspelt-key",
        "weight-over-100",
        "timeout-over-30",
        "scheduler-name-mismatch",
        "misspelt-top-level-key",
        "misspelt-top-level-section",
        "pull-secret-without-name",
        "unknown-node-selection",
        "unknown-tls-source",
        "removed-cert-manager-enabled",
        "removed-webhook-run-as-user",
        "removed-require-opt-in-label",
        "removed-cdi-spec-dir",
        "unknown-toleration-operator",
        "unknown-toleration-field",
        "no-connections",
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
    assert not [
        o
        for o in rendered("defaults")
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "scheduler"
    ]


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


def install_notes(values: dict[str, Any], tmp_path, kube_version: str = chartkit.KUBE_VERSIONS[-1]) -> str:
    """NOTES.txt as `helm install` prints it, for `kube_version` (chartkit.render_notes)."""
    return chartkit.render_notes(values, tmp_path, kube_version)


def test_notes_tell_how_to_annotate_a_pod_and_check_the_result(tmp_path):
    notes = install_notes({}, tmp_path)
    c = contract.Contract()
    assert f"{contract.KAI_GPU_FRACTION}: " in notes
    assert c.decision_annotation in notes
    assert "kubectl describe node" in notes and c.gpu_memory_resource in notes
    assert f"{c.label_node_enabled}=true" in notes


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"config": {"steering": {"cpuPods": False}}},
        {"config": {"convertWholeGpus": False}},
        {"webhook": {"excludeNamespaces": ["batch"]}},
    ],
    ids=["defaults", "cpu-pods-off", "no-whole-gpu-conversion", "excluded-namespace"],
)
def test_notes_say_exactly_which_pods_each_webhook_entry_intercepts_and_how_to_stop_it(values, tmp_path):
    notes = " ".join(install_notes(values, tmp_path).split())  # one line: the text wraps anywhere
    manifests = chartkit.render(values)
    entries = webhook_entries(manifests)
    c = contract.Contract()
    for name, hook in entries.items():
        assert f"{hook['name']} (failurePolicy {hook['failurePolicy']}" in notes, name
    for annotation in c.pod_annotations:
        assert annotation in notes
    converting = bool(values.get("config", {}).get("convertWholeGpus", True))
    assert ("requesting nvidia.com/gpu in any container" in notes) is converting
    assert ("WARNING: config.convertWholeGpus is off" in notes) is not converting
    (excluded,) = entries["pods"]["namespaceSelector"]["matchExpressions"]
    assert f"never in {', '.join(excluded['values'])})" in notes
    if "cpu-pods" in entries:
        assert "EVERY OTHER pod that asks for no GPU" in notes
        assert f'{c.label_pod_cpu_steering}: "off"' in notes
        assert "--set config.steering.cpuPods=false" in notes
    else:
        assert "cpu-pods." not in notes and "EVERY OTHER" not in notes


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


@pytest.mark.parametrize(
    "url, san",
    [
        ("https://127.0.0.1:9443", "IP:127.0.0.1"),
        ("https://[::1]:9443/base", "IP:::1"),
        ("https://webhook.dev.example.com", "DNS:webhook.dev.example.com"),
    ],
    ids=["ipv4", "ipv6-with-path", "dns-name"],
)
def test_an_external_webhook_url_replaces_the_service_and_the_certificate_names_its_host(url: str, san: str) -> None:
    manifests = chartkit.render({"webhook": {"externalURL": url, "tls": {"source": "generated"}}})
    for hook in manifests.one("MutatingWebhookConfiguration")["webhooks"]:
        assert hook["clientConfig"] == {"url": url + "/mutate", "caBundle": hook["clientConfig"]["caBundle"]}
    secret = manifests.one("Secret", "webhook")
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    shown = {f"DNS:{n}" for n in names.get_values_for_type(x509.DNSName)}
    shown |= {f"IP:{n}" for n in names.get_values_for_type(x509.IPAddress)}
    assert san in shown
    assert "DNS:gpuslice-webhook.gpuslice.svc" in shown  # the in-cluster names stay


@pytest.mark.parametrize("url", ["http://127.0.0.1:9443", "https://host/path?query=1", "https://", "127.0.0.1:9443"])
def test_an_external_webhook_url_that_is_not_a_plain_https_url_is_refused(url: str, tmp_path: pathlib.Path) -> None:
    result = chartkit.run_helm(*chartkit.template_args({"webhook": {"externalURL": url}}, tmp_path))
    assert result.returncode != 0
    assert "externalURL" in result.stderr
