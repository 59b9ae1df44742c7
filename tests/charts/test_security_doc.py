"""The chart README's Security table says exactly what each ServiceAccount may do in the API.

Every right the rendered chart grants (the rules of its own Roles and ClusterRoles, the stock
roles it binds) is read off real `helm template` output for the values that add rights, and
must have a row of the table for that component naming the verb and the resource; every row
must name only rights some render grants. Rules limited by resourceNames must say so.
"""

from __future__ import annotations

import re
from typing import Any

import chartkit
import pytest

pytestmark = pytest.mark.helm

LATEST = chartkit.KUBE_VERSIONS[-1]

# The values that change what the chart grants, with the Kubernetes version each renders for.
RENDERS: dict[str, tuple[dict[str, Any], str]] = {
    "defaults": ({}, LATEST),
    "pacing": ({"config": {"pacing": {"enabled": True}}}, LATEST),
    "no-requeue": ({"config": {"requeue": {"enabled": False}}}, LATEST),
    "no-monitor": ({"config": {"monitor": {"enabled": False}}}, LATEST),
    "evict": ({"config": {"monitor": {"overusePolicy": "evict"}}}, LATEST),
    "scheduler": ({"scheduler": {"enabled": True}}, LATEST),
    "dra": ({"mode": "dra"}, "1.36.0"),
    "dra-no-steering": ({"mode": "dra", "config": {"steering": {"enabled": False}}}, "1.36.0"),
    "both": ({"mode": "both"}, "1.36.0"),
    "both-with-claims": ({"mode": "both", "config": {"dra": {"enabled": True}}}, "1.36.0"),
}

# The app.kubernetes.io/component of each ServiceAccount -> how the table names it.
COMPONENTS = {
    "webhook": "webhook",
    "device-plugin": "device plugin",
    "controller": "controller",
    "dra-plugin": "DRA plugin",
    "scheduler": "scheduler",
}

# (component, verb, resource), or (component, "bound", stock role name)
Right = tuple[str, str, str]


def granted(manifests: chartkit.Manifests) -> dict[Right, bool]:
    """Every right of one render, each with whether a rule limits it by resourceNames."""
    accounts = {
        a["metadata"]["name"]: COMPONENTS[a["metadata"]["labels"]["app.kubernetes.io/component"]]
        for a in manifests.all("ServiceAccount")
    }
    rights: dict[Right, bool] = {}
    for binding in manifests.all("ClusterRoleBinding") + manifests.all("RoleBinding"):
        ref = binding["roleRef"]
        roles = [
            r
            for r in manifests.all(ref["kind"])
            if r["metadata"]["name"] == ref["name"]
            and r["metadata"].get("namespace") == binding["metadata"].get("namespace")
        ]
        for subject in binding["subjects"]:
            # A grant to an account the chart does not make would be a right for whoever makes it.
            assert subject["name"] in accounts, f"{binding['metadata']['name']} binds a missing {subject['name']}"
            component = accounts[subject["name"]]
            if not roles:  # a stock role of Kubernetes
                rights[component, "bound", ref["name"]] = False
            for rule in roles[0]["rules"] if roles else ():
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        right = (component, verb, resource)
                        rights[right] = rights.get(right, True) and bool(rule.get("resourceNames"))
    return rights


def security_rows() -> list[dict[str, str]]:
    """The rows of the README's Security table, by column."""
    text = (chartkit.CHART / "README.md").read_text()
    section = text.split("\n## Security\n", 1)[1].split("\n## ", 1)[0]
    lines = [line.strip() for line in section.splitlines() if line.strip().startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header[:2] == ["component (when)", "RBAC"] and "narrowed by" in header
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True)) for line in lines[2:]]


def documented(row: dict[str, str]) -> set[Right]:
    """The rights one row names: `verb, verb resource` clauses, or stock roles, separated by ';'."""
    component = next(
        c for c in sorted(COMPONENTS.values(), key=len, reverse=True) if row["component (when)"].startswith(c)
    )
    rights: set[Right] = set()
    for clause in row["RBAC"].split(";"):
        names = re.findall(r"`([^`]+)`", clause)
        assert names, f"no `resource` in {clause!r}"
        words = clause.split("`", 1)[0]
        if re.match(r"\s*(ClusterRoles?|Roles?)\b", words):
            rights |= {(component, "bound", name) for name in names}
        else:
            verbs = [v.strip() for v in words.split(",")]
            rights |= {(component, verb, name) for verb in verbs for name in names}
    return rights


@pytest.fixture(scope="module")
def rendered_rights() -> dict[str, dict[Right, bool]]:
    return {name: granted(chartkit.render(values, kube)) for name, (values, kube) in RENDERS.items()}


def test_every_right_the_chart_grants_has_a_row_of_the_security_table(rendered_rights):
    table = set().union(*(documented(row) for row in security_rows()))
    for name, rights in rendered_rights.items():
        assert sorted(set(rights) - table) == [], f"granted with {name} but not in the README's Security table"


def test_the_security_table_names_no_right_the_chart_does_not_grant(rendered_rights):
    everywhere = set().union(*(set(r) for r in rendered_rights.values()))
    for row in security_rows():
        assert sorted(documented(row) - everywhere) == [], row["RBAC"]


def test_rights_limited_to_named_objects_say_so(rendered_rights):
    for row in security_rows():
        for right in documented(row):
            if {rights[right] for rights in rendered_rights.values() if right in rights} == {True}:
                assert "resourceNames" in row["narrowed by"], row["RBAC"]


def test_the_webhook_writes_no_pod_and_the_controller_runs_only_where_kubelet_can_refuse(rendered_rights):
    """The webhook answers admissions and nothing else; the controller does not run where the webhook
    makes ResourceClaims (kubelet refuses nothing), and there is no device plugin there."""
    for rights in rendered_rights.values():
        assert not {r for r in rights if r[0] == "webhook" and r[1] in ("create", "delete", "patch", "update")} - {
            ("webhook", "create", "resourceclaimtemplates")
        }
    for name in ("dra", "both-with-claims"):
        rights = rendered_rights[name]
        assert not [r for r in rights if r[0] == "controller"]
        assert ("webhook", "create", "resourceclaimtemplates") in rights
    assert ("controller", "create", "pods") in rendered_rights["both"]  # the webhook serves the device-plugin half
    assert not [r for r in rendered_rights["dra"] if r[0] == "device plugin"]
