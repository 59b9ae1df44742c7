"""CPU-pod steering (`steering.cpuPods`): a pod that asks for no device gets a preference for
nodes without a fully free GPU (webhook/steering/'s `CpuPods` family), so its CPU and memory stay off the
nodes that whole-GPU pods will need. It is never refused and gets nothing else. Pure.

May import gpuslice.{config,contract} and the webhook's answerinputs, decoding, parsing, patches, pods and steering
modules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuslice import config
from gpuslice import contract as contract_
from gpuslice.webhook import answerinputs, decoding, parsing, patches, pods, steering

__all__ = ["asks_for_no_device", "cpu_asked", "key_rules", "nearly_full_mib", "patch"]

# What a pod may ask for and still count as asking for no device (hugepages-<size> too).
_PLAIN_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})


def patch(pod: Mapping[str, Any], settings: config.Config, inputs: answerinputs.Inputs) -> list[dict[str, Any]]:
    """The pod's patch: its affinity with the preferences added (and the pacer's gate, with pacing
    on while a pacer is alive); empty when steering is off, the pod is not one to steer, or it
    already has them."""
    contract = settings.contract
    if not (settings.steering.enabled and settings.steering.cpu_pods) or not asks_for_no_device(pod, contract):
        return []
    affinity = patches.merge_node_affinity(
        (pod.get("spec") or {}).get("affinity"),
        (),
        steering.cpu_pod_preferences(contract, nearly_full_mib(settings, inputs)),
    )
    if affinity is None:
        return []
    # Gated too, with pacing, so that it keeps its place among the GPU pods the pacer releases in
    # arrival order: let through at once, it would take the CPU beside GPUs that pods before it need.
    gate = patches.gate_ops(pod.get("spec") or {}, settings, pacer_absent=inputs.pacer_absent)
    return [{"op": "add", "path": "/spec/affinity", "value": affinity}, *gate]


def nearly_full_mib(settings: config.Config, inputs: answerinputs.Inputs) -> int:
    """`steering.cpuPodsNearlyFullMiB` while CPU-only pods ask more than
    `steering.cpuPodsNearlyFullCpuPercent` of the CPU admitted (webhook/cpudemand.py), else 0 (no
    band). Noted: a remembered answer holds only while the band is as it was."""
    bound, percent = settings.steering.cpu_pods_nearly_full_mib, settings.steering.cpu_pods_nearly_full_cpu_percent
    if bound <= 0 or percent <= 0:
        return bound
    return bound if inputs.cpu_pods_band(percent) else 0


def cpu_asked(decoded: decoding.Decoded) -> int:
    """The CPU the decoded pod asks: a steered CPU pod's answer is found by a key without its
    amounts, so its CPU may differ from that of the pod first answered."""
    plain = decoded.plain_requests()
    if plain is None:
        return pods.cpu_requested(decoded.requests_spec())
    return sum(parsing.cpu_milli(amounts.get("cpu", 0)) for amounts in plain if isinstance(amounts, dict))


def key_rules(contract: contract_.Contract) -> decoding.KeyRules:
    """What no answer of the webhook reads, for webhook/decoding.py's keys of remembered answers:
    pod labels but the steering opt-out; and the CPU and memory amounts of a pod that asks for no
    device (none of the annotations the webhook converts, only plain resources): its answer is
    this module's patch, which reads resource names only."""
    return decoding.KeyRules(
        labels_read=(contract.label_pod_cpu_steering,),
        device_annotations=contract.pod_annotations,
        plain=_plain_resource,
        plain_names=_PLAIN_RESOURCES,
        owner_opt_out=(contract.gpu_class_annotation, contract_.GPU_CLASS_ANY),
    )


def _plain_resource(name: str) -> bool:
    return name in _PLAIN_RESOURCES or name.startswith("hugepages-")


def asks_for_no_device(pod: Mapping[str, Any], contract: contract_.Contract) -> bool:
    """True for a pod the scheduler may place anywhere and that only competes for CPU and memory
    beside the GPUs: none of the annotations the webhook reads, no extended resource in any
    container, not pinned to a node (nodeName, DaemonSet), no node preferences of its own (they
    stay undiluted; this also makes reinvocation a no-op), and not opted out by label."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = metadata.get("annotations") or {}
    if any(k in annotations for k in contract.pod_annotations):
        return False
    if spec.get("nodeName") or (metadata.get("labels") or {}).get(contract.label_pod_cpu_steering) == "off":
        return False
    owners = metadata.get("ownerReferences") or ()
    if any(isinstance(o, Mapping) and o.get("kind") == "DaemonSet" for o in owners):
        return False
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    if node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution"):
        return False
    for _, _, container in pods.containers(spec):
        for amounts in pods.resource_maps(container):
            if not all(map(_plain_resource, amounts)):
                return False
    return True
