"""`helm upgrade` from the chart before the controller to this one, on the real API server.

Until eeffac3 the webhook ran the requeuer (pods create/delete, its journal's ConfigMaps) and a
separate pacer Deployment renewed its own Lease. The chart as it was then is packaged in
tests/e2e/fixtures/gpuslice-0.1.0-eeffac3.tgz (`helm package` of `git archive eeffac3
charts/gpuslice`). Installed with pacing on and then upgraded in place: the pacer Deployment and the
webhook's write rights go, the controller comes with them, and a journal entry the old webhook
left (written with the old webhook's own rights, through the old policy) is finished by the
controller with the new chart's rights. The rights are asked of the API server's own authorizer
(SubjectAccessReview), not read off the manifests.
"""

from __future__ import annotations

import asyncio
import functools
import json
import pathlib
from typing import Any

import chartkit
import k8skit
import kubernetes
import prometheus_client
import pytest

from gpuslice import config as config_
from gpuslice.controller import requeue, requeue_journal
from gpuslice.sim import controlplane, kube_components

pytestmark = [pytest.mark.e2e, pytest.mark.helm]

OLD_CHART = pathlib.Path(__file__).parent / "fixtures" / "gpuslice-0.1.0-eeffac3.tgz"
CONTRACT = config_.Config().contract
LEADING = b"\ngpuslice_controller_leading 1.0"


def allowed(
    admin: kubernetes.client.ApiClient,
    namespace: str,
    account: str,
    verb: str,
    resource: str,
    *,
    group: str = "",
    name: str = "",
) -> bool:
    """Whether the API server lets ServiceAccount `namespace`/`account` `verb` `resource` (`name`) in `namespace`."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{namespace}:{account}",
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"],
            "resourceAttributes": {
                "namespace": namespace,
                "verb": verb,
                "group": group,
                "resource": resource,
                "name": name,
            },
        },
    }
    answer = kubernetes.client.AuthorizationV1Api(admin).create_subject_access_review(review)
    return bool(answer.status.allowed)


def test_an_upgrade_moves_the_writes_from_the_webhook_to_the_controller_and_finishes_the_old_journal(
    cluster: controlplane.ControlPlane,
    core: kubernetes.client.CoreV1Api,
    admin: kubernetes.client.ApiClient,
    namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    release, home = "up", "gpuslice-upgrade"
    fullname = f"{release}-gpuslice"
    # No webhook process answers this release: Ignore, so that it cannot hold any pod of the test.
    values = chartkit.with_test_image(
        {
            "webhook": {
                "externalURL": f"https://127.0.0.1:{k8skit.free_port()}",
                "tls": {"source": "generated"},
                "failurePolicy": "Ignore",
            },
            "config": {"pacing": {"enabled": True}},
        }
    )
    values_file = tmp_path / "values.json"
    values_file.write_text(json.dumps(values))
    kubeconfig = cluster.admin_kubeconfig
    k8skit.helm(
        kubeconfig,
        "install",
        release,
        str(OLD_CHART),
        "--namespace",
        home,
        "--create-namespace",
        "-f",
        str(values_file),
    )
    try:
        apps = kubernetes.client.AppsV1Api(admin)
        assert {d.metadata.name for d in apps.list_namespaced_deployment(home).items} == {
            f"{fullname}-webhook",
            f"{fullname}-pacer",
        }
        webhook = f"{fullname}-webhook"
        assert allowed(admin, home, webhook, "create", "pods") and allowed(admin, home, webhook, "create", "configmaps")

        # What the old webhook's requeuer leaves when it dies between the delete and the create:
        # an entry, written with its own rights (the old policy allows it its entries).
        old = kubernetes.client.CoreV1Api(k8skit.api_client(_kubeconfig_of(cluster, core, home, webhook)))
        refused = k8skit.pod_object(
            "left-by-the-old-webhook", annotations={CONTRACT.decision_annotation: "{}"}, nodeSelector={"none": "none"}
        )
        refused["metadata"].update(namespace=namespace, uid="0b0e-refused-uid")
        refused["status"] = {"phase": "Failed", "reason": "UnexpectedAdmissionError"}
        assert asyncio.run(
            requeue_journal.Journal(old, home, CONTRACT).write(
                "0b0e-refused-uid", requeue.replacement(refused, CONTRACT)
            )
        )

        k8skit.helm(kubeconfig, "upgrade", release, str(chartkit.CHART), "--namespace", home, "-f", str(values_file))

        deployments = {d.metadata.name: d for d in apps.list_namespaced_deployment(home).items}
        assert set(deployments) == {f"{fullname}-webhook", f"{fullname}-controller"}
        assert deployments[f"{fullname}-controller"].spec.replicas == 2
        rbac = kubernetes.client.RbacAuthorizationV1Api(admin)
        roles = {r.metadata.name for r in rbac.list_namespaced_role(home).items}
        assert roles == {
            f"{fullname}-controller-lease",
            f"{fullname}-controller-requeue-journal",
            f"{webhook}-controller-lease",
        }
        # The webhook writes nothing any more; it still reads pods and the controller's Lease.
        for verb, resource in (("create", "pods"), ("delete", "pods"), ("create", "configmaps"), ("create", "events")):
            assert not allowed(admin, home, webhook, verb, resource), (verb, resource)
        assert allowed(admin, home, webhook, "list", "pods") and allowed(admin, home, webhook, "watch", "pods")
        controller = f"{fullname}-controller"
        for verb, resource in (("create", "pods"), ("delete", "pods"), ("create", "configmaps"), ("create", "events")):
            assert allowed(admin, home, controller, verb, resource), (verb, resource)
        lease = {"group": "coordination.k8s.io", "name": controller}
        assert allowed(admin, home, controller, "update", "leases", **lease)
        assert allowed(admin, home, webhook, "get", "leases", **lease)
        assert not allowed(admin, home, webhook, "update", "leases", **lease)
        rendered = _rendered_config(core, home, fullname, tmp_path)
        assert rendered.controller.lease_name == controller and rendered.pacing.enabled
        assert rendered.requeue == config_.RequeueConfig()

        # The entry the old webhook left is finished with the controller's rights, through the new policy.
        own = kubernetes.client.CoreV1Api(k8skit.api_client(_kubeconfig_of(cluster, core, home, controller)))
        requeuer = requeue.Requeuer(own, rendered, registry=prometheus_client.CollectorRegistry(), namespace=home)
        done = asyncio.run(requeuer.finish_journal(grace_seconds=0))
        assert done.created == [f"{namespace}/left-by-the-old-webhook"], done
        assert core.list_namespaced_config_map(home, label_selector=f"{CONTRACT.prefix}/requeue-journal").items == []

        # And the controller itself runs with those rights: it elects itself on its Lease.
        process, port = kube_components.start_controller(
            cluster,
            tmp_path / "config.yaml",
            _kubeconfig_of(cluster, core, home, controller),
            name="controller-upgraded",
            env={"POD_NAMESPACE": home},
        )
        try:
            leading = functools.partial(kube_components.controller_answers, port, "/metrics", LEADING)
            k8skit.wait_for("the upgraded controller to lead", leading, timeout=30)
            lease = kubernetes.client.CoordinationV1Api(admin).read_namespaced_lease(controller, home)
            assert lease.spec.holder_identity == "controller-upgraded"
        finally:
            cluster.stop_process(process)
    finally:
        k8skit.helm(kubeconfig, "uninstall", release, "--namespace", home, check=False)


def _kubeconfig_of(
    cluster: controlplane.ControlPlane, core: kubernetes.client.CoreV1Api, namespace: str, account: str
) -> str:
    token = k8skit.service_account_token(core, namespace, account)
    return cluster.write_kubeconfig(f"{account}-upgrade", token=token)


def _rendered_config(core: kubernetes.client.CoreV1Api, namespace: str, fullname: str, tmp_path: pathlib.Path) -> Any:
    path = tmp_path / "config.yaml"
    path.write_text(core.read_namespaced_config_map(f"{fullname}-config", namespace).data["config.yaml"])
    return config_.load(path, environ={})
