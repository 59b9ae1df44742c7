"""A burst on the real control plane: a Deployment's replicas created at once, admitted by our webhook,
placed by the real kube-scheduler, admitted on the node by kubelet's real device manager through our
device plugin (nodeagent.py plays kubelet's pod loop), with our labeller publishing each node's
labels to the real API server at the chart's default rate limit. Labels lag the scheduler here: it
binds the whole burst in milliseconds, and a node's labels move at most once per 2 s. What must hold
is that no replica is lost: a pod kubelet refuses (its share does not fit on one GPU of the node
the stale labels let through) is terminal, the ReplicaSet controller makes a new one, and the new
one is placed by then-current labels. docs/steering.md ("Bursts") describes this.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import signal
from collections.abc import Iterator
from typing import Any

import k8skit
import kubernetes
import nodeagent
import prometheus_client
import pytest
import yaml

from gpuslice import config as config_
from gpuslice import contract as contract_
from gpuslice.controller import requeue, requeue_journal
from gpuslice.sim import controlplane

pytestmark = [pytest.mark.e2e, pytest.mark.helm]

CONTRACT = config_.Config().contract
GPU_MEMORY = CONTRACT.gpu_memory_resource
GROUP = "e2e.gpuslice.io/group"
JOURNAL_LABEL = f"{CONTRACT.prefix}/requeue-journal"
NODES = 2
UNITS_PER_H100 = 81559 // 256  # 318


def _two_h100_node_file(directory: pathlib.Path) -> pathlib.Path:
    """The demo node's two H100s, without the MIG A100 (only shares in this test)."""
    document = yaml.safe_load((k8skit.EXAMPLES / "demo-node.yaml").read_text())
    document["gpus"] = [gpu for gpu in document["gpus"] if "mig" not in gpu]
    path = directory / "two-h100.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.fixture
def gpu_nodes(
    release: Any,
    cluster: controlplane.ControlPlane,
    core: kubernetes.client.CoreV1Api,
    nodes: list[str],
    namespace: str,
    workdir: pathlib.Path,
) -> Iterator[dict[str, nodeagent.NodeAgent]]:
    """NODES nodes of 2 x H100, each with kubelet's device manager, our device plugin and labeller (the
    chart's ServiceAccount, default rate limits) and the node agent admitting bound pods."""
    from gpuslice.deviceplugin import nodefile

    node_file = _two_h100_node_file(workdir)
    inventory = nodefile.load(node_file)
    account = f"{release.fullname}-device-plugin"
    agents: dict[str, nodeagent.NodeAgent] = {}
    started: list[tuple[k8skit.Harness, Any]] = []
    try:
        for i in range(NODES):
            name = f"{namespace}-{i}"
            core.create_node(k8skit.gpu_node_object(name, inventory, extra_labels={GROUP: namespace}))
            nodes.append(name)
            plugin_pod = core.create_namespaced_pod(
                release.namespace,
                k8skit.pod_object(f"plugin-{namespace}-{i}", serviceAccountName=account, nodeName=name),
            )
            harness = k8skit.Harness(cluster, workdir, name=f"dmharness-{name}")
            harness.state_file = workdir / f"harness-{i}.json"
            harness.start()
            plugin = k8skit.start_device_plugin(
                cluster,
                harness,
                node_file,
                name=f"device-plugin-{name}",
                node_name=name,
                kubeconfig=release.kubeconfig_of(account, bound_pod=plugin_pod),
            )
            started.append((harness, plugin))
            k8skit.wait_for(
                f"{name}'s plugin in the device manager",
                lambda h=harness: h.allocatable(GPU_MEMORY) == 2 * UNITS_PER_H100 or None,
            )
            agents[name] = nodeagent.NodeAgent(core, name, harness).start()
        yield agents
    finally:
        for agent in agents.values():
            agent.stop()
        for harness, plugin in started:
            cluster.stop_process(plugin.process)
            harness.close()


def gpus_held(gpu_nodes: dict[str, nodeagent.NodeAgent], namespace: str) -> set[tuple[str, str]]:
    """(node, GPU UUID) of every GPU the admitted pods of `namespace` hold units of; no node agent
    may have met an error."""
    gpus = set()
    for agent in gpu_nodes.values():
        assert not agent.errors, agent.errors
        for decision in agent.decisions.values():
            if decision.admitted and decision.namespace == namespace and not decision.released:
                gpus |= {(agent.node, contract_.parse_unit_device_id(i).gpu_uuid) for i in decision.devices[GPU_MEMORY]}
    return gpus


def _deployment(name: str, group: str, replicas: int, fraction: str) -> dict[str, Any]:
    pod = k8skit.pod_object("unused", annotations={"gpu-fraction": fraction}, limits={"nvidia.com/gpu": 1})
    template = {
        "metadata": {"labels": {"app": name}, "annotations": pod["metadata"]["annotations"]},
        "spec": {**pod["spec"], "nodeSelector": {GROUP: group}},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": template},
    }


@pytest.fixture(params=["default-scheduler", "binpack-profile"])
def scheduler_profile(
    request: pytest.FixtureRequest, release: Any, cluster: controlplane.ControlPlane, core: kubernetes.client.CoreV1Api
) -> Iterator[str]:
    """The stock profile (the session's kube-scheduler), or the chart's bin-packing profile
    (MostAllocated on gpu-memory: every pod of a burst goes to the node already in use, the case
    that runs furthest ahead of the labels) in a second real kube-scheduler."""
    if request.param == "default-scheduler":
        yield request.param
        return
    original = json.loads(json.dumps(release.values))
    release.upgrade({**original, "scheduler": {"enabled": True}})
    scheduler = None
    try:
        config_map = core.read_namespaced_config_map(f"{release.fullname}-scheduler", release.namespace)
        configuration = yaml.safe_load(config_map.data["scheduler-config.yaml"])
        scheduler = cluster.start_scheduler(
            "kube-scheduler-burst",
            configuration=configuration,
            kubeconfig=release.kubeconfig_of(f"{release.fullname}-scheduler"),
        )
        yield str(configuration["profiles"][0]["schedulerName"])
    finally:
        if scheduler is not None:
            cluster.stop_process(scheduler)
        release.upgrade(original)


def test_a_burst_of_replicas_ahead_of_the_labels_loses_no_replica(
    admin: kubernetes.client.ApiClient,
    core: kubernetes.client.CoreV1Api,
    scheduler_profile: str,
    gpu_nodes: dict[str, nodeagent.NodeAgent],
    namespace: str,
) -> None:
    # 4 replicas of 0.6 GPU on 2 nodes x 2 GPUs: exactly one per GPU. A node's total (636 units) takes
    # three of 191, so the scheduler may bind a third to a node before its labels move; kubelet then
    # refuses it (no single GPU has 191 units left) and the ReplicaSet controller replaces it.
    replicas = 2 * NODES
    kubernetes.client.AppsV1Api(admin).create_namespaced_deployment(
        namespace, _deployment("burst", namespace, replicas, "0.6")
    )

    def all_running() -> list[Any] | None:
        pods = core.list_namespaced_pod(namespace, label_selector="app=burst").items
        running = [p for p in pods if p.status.phase == "Running"]
        return running if len(running) == replicas else None

    running = k8skit.wait_for("every replica to run", all_running, timeout=180, interval=0.5)
    for agent in gpu_nodes.values():
        assert not agent.errors, agent.errors

    # Every running replica holds 191 units on one GPU, and no GPU holds two (they would not fit).
    held: dict[tuple[str, str], int] = {}
    for agent in gpu_nodes.values():
        for decision in agent.decisions.values():
            if not decision.admitted or decision.namespace != namespace or decision.released:
                continue
            ids = decision.devices[GPU_MEMORY]
            gpus = {contract_.parse_unit_device_id(i).gpu_uuid for i in ids}
            assert len(ids) == int(0.6 * UNITS_PER_H100) and len(gpus) == 1, decision
            key = (agent.node, gpus.pop())
            held[key] = held.get(key, 0) + 1
    assert len(running) == replicas and sorted(held.values()) == [1] * replicas, held

    # What kubelet refused is terminal and says why: our plugin's cross-GPU refusal.
    pods = core.list_namespaced_pod(namespace, label_selector="app=burst").items
    failed = [p for p in pods if p.status.phase == "Failed"]
    for pod in failed:
        assert pod.status.reason == nodeagent.REFUSED_REASON, pod.status
        assert "one GPU" in (pod.status.message or ""), pod.status.message
    refusals = sum(len(agent.refusals()) for agent in gpu_nodes.values())
    assert refusals == len(failed)
    print(f"{scheduler_profile}: burst of {replicas}: {refusals} kubelet refusals, all replaced")


def test_a_burst_of_bare_pods_ahead_of_the_labels_loses_none_the_controller_requeues_the_refused(
    release: Any,
    core: kubernetes.client.CoreV1Api,
    scheduler_profile: str,
    gpu_nodes: dict[str, nodeagent.NodeAgent],
    namespace: str,
) -> None:
    # The same four shares as bare pods created back to back (no ReplicaSet slow start): the
    # scheduler binds them before any label moves, and without a controller a refused pod would
    # stay Failed. The controller's leader (config.requeue, on in the chart) recreates it.
    names = [f"bare-{i}" for i in range(2 * NODES)]
    for name in names:
        pod = k8skit.pod_object(
            name, annotations={"gpu-fraction": "0.6"}, limits={"nvidia.com/gpu": 1}, nodeSelector={GROUP: namespace}
        )
        core.create_namespaced_pod(namespace, pod)

    running = k8skit.all_running(core, namespace, names, "every bare pod to run")
    assert len(gpus_held(gpu_nodes, namespace)) == len(names)  # one per GPU

    refusals = sum(len(agent.refusals()) for agent in gpu_nodes.values())
    requeued = {
        p.metadata.name: int((p.metadata.annotations or {}).get(CONTRACT.requeues_annotation, "0")) for p in running
    }
    assert sum(requeued.values()) == refusals, (requeued, refusals)
    events = core.list_namespaced_event(namespace, field_selector="reason=Requeued").items
    assert len(events) == refusals
    for event in events:
        assert "refused the pod" in event.message and event.involved_object.name in names
    # Each replacement was written down before its pod was deleted, and forgotten once it existed.
    journal = core.list_namespaced_config_map(release.namespace, label_selector=JOURNAL_LABEL).items
    assert journal == [], [c.metadata.name for c in journal]
    print(f"{scheduler_profile}: {len(names)} bare pods: {refusals} kubelet refusals, all requeued")


def test_a_requeue_a_dead_leader_left_half_done_is_finished_from_its_journal(
    release: Any, core: kubernetes.client.CoreV1Api, namespace: str
) -> None:
    # As the controller's ServiceAccount under the chart's RBAC: a requeuer writes down a refused
    # pod's replacement and deletes the pod, then dies before its create. The next leader's pass
    # (the standby taking over, or this one restarted) creates it from the journal.
    settings = config_.Config()
    own = kubernetes.client.CoreV1Api(k8skit.api_client(release.kubeconfig_of(f"{release.fullname}-controller")))
    pod = k8skit.pod_object(
        "half-requeued", annotations={CONTRACT.decision_annotation: "{}"}, nodeSelector={GROUP: "none"}
    )
    created = core.create_namespaced_pod(namespace, pod)
    refused = core.api_client.sanitize_for_serialization(created)
    dead = requeue.Requeuer(
        own, settings, registry=prometheus_client.CollectorRegistry(), namespace=release.namespace, leading=True
    )
    assert asyncio.run(dead.journal.write(created.metadata.uid, requeue.replacement(refused, CONTRACT)))
    own.delete_namespaced_pod("half-requeued", namespace, grace_period_seconds=0)
    k8skit.wait_for("the pod to be gone", lambda: "half-requeued" not in _pod_names(core, namespace))

    after = requeue.Requeuer(
        own, settings, registry=prometheus_client.CollectorRegistry(), namespace=release.namespace, leading=True
    )
    done = asyncio.run(after.finish_journal(grace_seconds=0))
    assert done.created == [f"{namespace}/half-requeued"], done
    again = core.read_namespaced_pod("half-requeued", namespace)
    assert again.metadata.uid != created.metadata.uid
    assert again.metadata.annotations[CONTRACT.requeues_annotation] == "1"
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.uid={again.metadata.uid}").items
    requeued = [e.message for e in events if e.reason == "Requeued"]  # the scheduler's own events beside it
    assert len(requeued) == 1 and "requeue journal" in requeued[0], [(e.reason, e.message) for e in events]
    assert core.list_namespaced_config_map(release.namespace, label_selector=JOURNAL_LABEL).items == []
    # Finished once: a second pass finds nothing to do.
    assert asyncio.run(after.journal.recover(after._create, grace_seconds=0)) == requeue_journal.Recovered()


def test_the_controller_may_write_only_its_journals_configmaps(
    release: Any, core: kubernetes.client.CoreV1Api, admin: kubernetes.client.ApiClient
) -> None:
    # The chart's Role lets the controller create and delete any ConfigMap of its namespace (RBAC cannot
    # name objects not made yet); its ValidatingAdmissionPolicy narrows that to journal entries.
    own = kubernetes.client.CoreV1Api(k8skit.api_client(release.kubeconfig_of(f"{release.fullname}-controller")))
    journal = requeue_journal.Journal(own, release.namespace, CONTRACT)
    chart_config = f"{release.fullname}-config"

    def refused(call: Any) -> str:
        with pytest.raises(kubernetes.client.ApiException) as error:
            call()
        assert error.value.status == 403, error.value
        return k8skit.api_error_message(error.value)

    def in_force() -> bool | None:
        # The API server loads a new policy a moment after it is created; a probe that gets through
        # meanwhile is undone.
        probe = kubernetes.client.V1ConfigMap(metadata=kubernetes.client.V1ObjectMeta(name="journal-policy-probe"))
        try:
            own.create_namespaced_config_map(release.namespace, probe)
        except kubernetes.client.ApiException as exc:
            return exc.status == 403 or None
        core.delete_namespaced_config_map("journal-policy-probe", release.namespace)
        return None

    k8skit.wait_for("the journal policy to be in force", in_force, timeout=60, interval=0.5)
    policy = kubernetes.client.AdmissionregistrationV1Api(admin).read_validating_admission_policy(
        f"{release.fullname}-controller-requeue-journal"
    )
    assert not (policy.status and policy.status.type_checking and policy.status.type_checking.expression_warnings)

    message = refused(lambda: own.delete_namespaced_config_map(chart_config, release.namespace))
    assert "may write only its requeue journal's ConfigMaps" in message, message
    assert core.read_namespaced_config_map(chart_config, release.namespace).data["config.yaml"]
    # A ConfigMap with an entry's name but not its label is not an entry.
    bare = kubernetes.client.V1ConfigMap(metadata=kubernetes.client.V1ObjectMeta(name=journal.entry_name("x")))
    refused(lambda: own.create_namespaced_config_map(release.namespace, bare))

    pod = k8skit.pod_object("journal-policy")
    pod["metadata"]["namespace"] = release.namespace
    assert asyncio.run(journal.write("policy-uid", pod))  # its own entries: allowed
    assert [e.uid for e in asyncio.run(journal.entries())] == ["policy-uid"]
    asyncio.run(journal.forget("policy-uid"))
    assert asyncio.run(journal.entries()) == []


def _pod_names(core: kubernetes.client.CoreV1Api, namespace: str) -> set[str]:
    return {p.metadata.name for p in core.list_namespaced_pod(namespace).items}


def test_the_controller_leader_killed_in_the_middle_of_a_burst_loses_no_pod(
    release: Any,
    core: kubernetes.client.CoreV1Api,
    gpu_nodes: dict[str, nodeagent.NodeAgent],
    namespace: str,
) -> None:
    # The burst of bare pods above, with the controller's leader killed (SIGKILL: no Lease given
    # up) as the last pod is created: the refused pods wait as Failed until the standby's Lease
    # check finds the leader's renewal expired, and the standby, whose views were listed all
    # along, recreates them.
    standby = release.start_controller("controller-standby")
    (leader,) = [c for c in release.controllers if c.leading]
    assert leader is not standby
    names = [f"chaos-{i}" for i in range(2 * NODES)]
    for name in names:
        pod = k8skit.pod_object(
            name, annotations={"gpu-fraction": "0.6"}, limits={"nvidia.com/gpu": 1}, nodeSelector={GROUP: namespace}
        )
        core.create_namespaced_pod(namespace, pod)
    os.killpg(leader.process.popen.pid, signal.SIGKILL)
    release.stop_controller(leader)

    running = k8skit.all_running(core, namespace, names, "every pod to run after the leader was killed", timeout=120)
    assert standby.leading
    assert len(gpus_held(gpu_nodes, namespace)) == len(names)  # one per GPU: nothing overcommitted
    refusals = sum(len(agent.refusals()) for agent in gpu_nodes.values())
    requeued = sum(int((p.metadata.annotations or {}).get(CONTRACT.requeues_annotation, "0")) for p in running)
    assert requeued == refusals, (requeued, refusals)
    assert core.list_namespaced_config_map(release.namespace, label_selector=JOURNAL_LABEL).items == []
    print(f"leader killed mid-burst: {refusals} kubelet refusals, all requeued by the standby")
