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
import concurrent.futures
import dataclasses
import json
import os
import pathlib
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import k8skit
import kubernetes
import nodeagent
import prometheus_client
import prometheus_client.parser
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


@dataclasses.dataclass
class NodePlugin:
    """One node's device plugin process, and how its DaemonSet would start it again."""

    harness: k8skit.Harness
    start: Callable[[], k8skit.DevicePlugin]
    plugin: k8skit.DevicePlugin

    def restart(self) -> None:
        self.plugin = self.start()


@pytest.fixture
def device_plugins() -> dict[str, NodePlugin]:
    """Each gpu_nodes node's device plugin, by node name (gpu_nodes fills it)."""
    return {}


@pytest.fixture
def gpu_nodes(
    release: Any,
    cluster: controlplane.ControlPlane,
    core: kubernetes.client.CoreV1Api,
    nodes: list[str],
    namespace: str,
    workdir: pathlib.Path,
    device_plugins: dict[str, NodePlugin],
) -> Iterator[dict[str, nodeagent.NodeAgent]]:
    """NODES nodes of 2 x H100, each with kubelet's device manager, our device plugin and labeller (the
    chart's ServiceAccount, default rate limits) and the node agent admitting bound pods."""
    from gpuslice.node import nodefile

    node_file = _two_h100_node_file(workdir)
    inventory = nodefile.load(node_file)
    account = f"{release.fullname}-device-plugin"
    agents: dict[str, nodeagent.NodeAgent] = {}
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
            kubeconfig = release.kubeconfig_of(account, bound_pod=plugin_pod)

            def start(harness: k8skit.Harness = harness, name: str = name, kubeconfig: str = kubeconfig) -> Any:
                return k8skit.start_device_plugin(
                    cluster, harness, node_file, name=f"device-plugin-{name}", node_name=name, kubeconfig=kubeconfig
                )

            device_plugins[name] = NodePlugin(harness, start, start())
            k8skit.wait_for(
                f"{name}'s plugin in the device manager",
                lambda h=harness: h.allocatable(GPU_MEMORY) == 2 * UNITS_PER_H100 or None,
            )
            agents[name] = nodeagent.NodeAgent(core, name, harness).start()
        yield agents
    finally:
        for agent in agents.values():
            agent.stop()
        for node_plugin in device_plugins.values():
            cluster.stop_process(node_plugin.plugin.process)
            node_plugin.harness.close()


def gpus_held(gpu_nodes: dict[str, nodeagent.NodeAgent], namespace: str) -> set[tuple[str, str]]:
    """(node, GPU UUID) of every GPU the admitted pods of `namespace` hold units of; no node agent
    may have met an error."""
    gpus = set()
    for agent in gpu_nodes.values():
        assert not agent.errors, agent.errors
        for decision in agent.decided():
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
        for decision in agent.decided():
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
    # (the standby taking over, or this one restarted) creates it from the journal. The release's
    # own controller is stopped meanwhile: taking the Lease, it would finish the entry itself.
    for controller in list(release.controllers):
        release.stop_controller(controller)
    try:
        _finish_a_half_done_requeue(release, core, namespace)
    finally:
        release.start_controller()


def _finish_a_half_done_requeue(release: Any, core: kubernetes.client.CoreV1Api, namespace: str) -> None:
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
    # Where kubelet refused none, every pod runs before the leader's Lease expires: the standby
    # takes it over then, and must within the Lease's duration and a renewal period.
    k8skit.wait_for("the standby to take the Lease", lambda: standby.leading or None, timeout=60, interval=0.5)
    assert len(gpus_held(gpu_nodes, namespace)) == len(names)  # one per GPU: nothing overcommitted
    refusals = sum(len(agent.refusals()) for agent in gpu_nodes.values())
    requeued = sum(int((p.metadata.annotations or {}).get(CONTRACT.requeues_annotation, "0")) for p in running)
    assert requeued == refusals, (requeued, refusals)
    assert core.list_namespaced_config_map(release.namespace, label_selector=JOURNAL_LABEL).items == []
    print(f"leader killed mid-burst: {refusals} kubelet refusals, all requeued by the standby")


def _share_pod(name: str, group: str) -> dict[str, Any]:
    """A bare pod of 0.6 GPU for the nodes of `group`: one such pod per H100."""
    return k8skit.pod_object(
        name, annotations={"gpu-fraction": "0.6"}, limits={"nvidia.com/gpu": 1}, nodeSelector={GROUP: group}
    )


def _create_together(core: kubernetes.client.CoreV1Api, namespace: str, names: Sequence[str]) -> int:
    """Creates the 0.6-GPU pods `names` at once (a thread each) as a client would: a create the API
    server could not have admitted (the webhook replica it called died: "failed calling webhook",
    under the chart's failurePolicy Fail) is sent again. Returns how many creates were sent again."""

    def one(name: str) -> int:
        for attempt in range(5):
            try:
                core.create_namespaced_pod(namespace, _share_pod(name, namespace))
                return attempt
            except kubernetes.client.ApiException as exc:
                if exc.status == 409 and attempt:  # an earlier attempt got through after all
                    return attempt
                if "failed calling webhook" not in k8skit.api_error_message(exc) or attempt == 4:
                    raise
        raise AssertionError("unreachable")

    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        return sum(pool.map(one, names))


def _requeued(pods: Sequence[Any]) -> int:
    return sum(int((p.metadata.annotations or {}).get(CONTRACT.requeues_annotation, "0")) for p in pods)


@dataclasses.dataclass
class Replica:
    """One webhook replica behind the proxy, and the CA its certificate is signed by."""

    webhook: k8skit.Webhook
    cafile: str

    def admissions(self) -> float:
        """AdmissionReviews it has answered (its own Prometheus counter)."""
        status, body = controlplane._https_get(self.webhook.url + "/metrics", self.cafile)
        assert status == 200
        families = prometheus_client.parser.text_string_to_metric_families(body.decode())
        family = next(f for f in families if f.name == "gpuslice_webhook_admissions")
        return sum(s.value for s in family.samples if s.name == "gpuslice_webhook_admissions_total")


@pytest.fixture
def webhook_replicas(
    release: Any, cluster: controlplane.ControlPlane, core: kubernetes.client.CoreV1Api
) -> Iterator[list[Replica]]:
    """The release's webhook as two replicas behind the replay's round-robin proxy (sim/rrproxy.py) on
    the address the chart registered (webhook.externalURL), as the chart's Service spreads the API
    server's connections over its Deployment's two pods; the one webhook again afterwards."""
    secret = core.read_namespaced_secret(f"{release.fullname}-webhook-tls", release.namespace)
    release.stop_webhook()
    replicas: list[Replica] = []
    proxy = None
    try:
        for i in range(2):
            name = f"webhook-{release.name}-replica-{i}"
            webhook = k8skit.start_webhook(
                cluster,
                name,
                tls_secret=secret,
                config_yaml=release.config_yaml(),
                kubeconfig=release.kubeconfig_of(f"{release.fullname}-webhook"),
                port=k8skit.free_port(),
                env={"POD_NAMESPACE": release.namespace},
            )
            replicas.append(Replica(webhook, str(cluster.workdir / name / "ca.crt")))
        proxy = cluster.spawn(
            f"webhook-proxy-{release.name}",
            [
                sys.executable,
                "-m",
                "gpuslice.sim.rrproxy",
                f"--listen=127.0.0.1:{release.port}",
                *(f"--backend=127.0.0.1:{r.webhook.port}" for r in replicas),
            ],
        )

        def answers() -> bool:
            try:
                return controlplane._https_get(f"https://127.0.0.1:{release.port}/readyz", replicas[0].cafile)[0] == 200
            except OSError:
                return False

        k8skit.wait_for("the webhook proxy to answer", answers, timeout=30)
        yield replicas
    finally:
        if proxy is not None:
            cluster.stop_process(proxy)
        for replica in replicas:
            cluster.stop_process(replica.webhook.process)
        release.start_webhook()


def test_a_webhook_replica_killed_in_the_middle_of_a_burst_loses_no_pod(
    release: Any,
    cluster: controlplane.ControlPlane,
    core: kubernetes.client.CoreV1Api,
    gpu_nodes: dict[str, nodeagent.NodeAgent],
    webhook_replicas: list[Replica],
    namespace: str,
) -> None:
    # The four shares of one per GPU, half created together, then the replica that answered more of
    # them killed (SIGKILL: connections cut, no goodbye), then the other half. The proxy passes the
    # dead replica over, as a Service drops a dead pod's endpoint; the survivor converts the rest.
    names = [f"hook-chaos-{i}" for i in range(2 * NODES)]
    half = len(names) // 2
    sent_again = _create_together(core, namespace, names[:half])
    victim, survivor = sorted(webhook_replicas, key=Replica.admissions, reverse=True)
    assert victim.admissions() > 0
    before = survivor.admissions()
    os.killpg(victim.webhook.process.popen.pid, signal.SIGKILL)
    cluster.stop_process(victim.webhook.process)  # reaps it
    # Every new connection reaches the survivor, whichever replica's turn it is.
    proxy_url = f"https://127.0.0.1:{release.port}/readyz"
    assert [controlplane._https_get(proxy_url, survivor.cafile)[0] for _ in range(4)] == [200] * 4
    sent_again += _create_together(core, namespace, names[half:])

    for name in names[half:]:  # created after the kill: converted all the same
        pod = core.read_namespaced_pod(name, namespace)
        assert GPU_MEMORY in (pod.spec.containers[0].resources.limits or {}), pod.spec.containers[0].resources
        assert CONTRACT.decision_annotation in (pod.metadata.annotations or {}), pod.metadata.annotations
    assert survivor.admissions() - before >= len(names) - half

    running = k8skit.all_running(core, namespace, names, "every pod to run after a webhook replica was killed")
    assert len(gpus_held(gpu_nodes, namespace)) == len(names)  # one per GPU: nothing overcommitted
    refusals = sum(len(agent.refusals()) for agent in gpu_nodes.values())
    assert _requeued(running) == refusals, (_requeued(running), refusals)
    print(
        f"webhook replica killed mid-burst: {refusals} kubelet refusals, all requeued; "
        f"{sent_again} creates sent again after a failed webhook call"
    )


def test_a_device_plugin_killed_in_the_middle_of_a_burst_loses_no_pod_and_overcommits_no_gpu(
    cluster: controlplane.ControlPlane,
    core: kubernetes.client.CoreV1Api,
    gpu_nodes: dict[str, nodeagent.NodeAgent],
    device_plugins: dict[str, NodePlugin],
    namespace: str,
) -> None:
    # Three of the four one-per-GPU shares first: one node holds two, the other one and has a GPU
    # free. That node's plugin is killed (SIGKILL) with its pod's units held, and the last share can
    # only go there: kubelet's device manager refuses it while the plugin is gone, the controller
    # requeues it, and the plugin started again (as its DaemonSet would) must count the units held
    # before it died: kubelet's checkpoint and PodResources, not the plugin's memory, say what is taken.
    names = [f"plugin-chaos-{i}" for i in range(2 * NODES)]
    _create_together(core, namespace, names[:-1])
    k8skit.all_running(core, namespace, names[:-1], "the first three pods to run")
    per_node = {node: sum(1 for n, _ in gpus_held(gpu_nodes, namespace) if n == node) for node in gpu_nodes}
    (victim,) = [node for node, held in per_node.items() if held == 1]
    agent, node_plugin = gpu_nodes[victim], device_plugins[victim]
    refused_before = len(agent.refusals())
    os.killpg(node_plugin.plugin.process.popen.pid, signal.SIGKILL)
    cluster.stop_process(node_plugin.plugin.process)  # reaps it
    _create_together(core, namespace, names[-1:])

    k8skit.wait_for(
        f"{victim}'s kubelet to refuse the last pod while its plugin is gone",
        lambda: len(agent.refusals()) > refused_before,
        timeout=60,
    )
    refusal = agent.refusals()[-1].message
    node_plugin.restart()

    running = k8skit.all_running(core, namespace, names, "every pod to run after the plugin came back", timeout=120)
    assert len(gpus_held(gpu_nodes, namespace)) == len(names)  # one per GPU: nothing overcommitted
    assert node_plugin.harness.allocatable(GPU_MEMORY) == 2 * UNITS_PER_H100
    refusals = sum(len(agent.refusals()) for agent in gpu_nodes.values())
    assert _requeued(running) == refusals, (_requeued(running), refusals)

    # The restarted plugin's labels count both of the node's pods, the one held across its death too.
    def labels() -> dict[str, str] | None:
        found = core.read_node(victim).metadata.labels
        return found if found.get(CONTRACT.label_free_gpus) == "0" else None

    found = k8skit.wait_for(f"{victim}'s labels to count both its pods", labels, timeout=30)
    assert found[CONTRACT.label_free_block_units] == str(UNITS_PER_H100 - int(0.6 * UNITS_PER_H100)), found
    print(f"device plugin killed mid-burst: {refusals} kubelet refusals, all requeued; while gone: {refusal}")
