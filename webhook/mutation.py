"""The conversion of one pod: a pod with KAI-style annotations in, an allow/deny outcome and a
JSON patch out. Pure and fast (the simulator calls it for every pod it places); no I/O, no clock.

`mutate` is the flow of a pod; each step is its own module (docs/webhook.md explains the
conversions for users):
  annotations  read and check gpu-fraction / gpu-memory / isolation / num-devices / mig-or-share,
               find the container
  shares       a share of one GPU -> units (or a MIG device), choosing the GPU class (classchoice)
  wholegpus    nvidia.com/gpu: N (convertWholeGpus, no annotations) -> N GPUs of units of one class
  foreign      other systems' names (convertWholeGpus): NVIDIA's nvidia.com/mig-<profile> -> our MIG
               resource, HAMi's nvidia.com/gpumem(-percentage) -> a share; what cannot map refused
  patches      the conversion -> requests and limits, scheduler, node affinity, decision annotation
  dra_claims   the same conversion as a ResourceClaim instead (DRA mode)
  cpupods      a pod that asks for no device -> a preference for nodes without a free whole GPU
Bad input is denied with a message naming the annotation, the value and the accepted forms; a
denied pod gets no patch. A container that already carries a gpuslice resource is left alone,
so reinvocation never adds a second or conflicting conversion.

May import gpuslice.config and the webhook's pure modules. Of the cluster view it takes only the
seam (`ClusterView.inputs`, webhook/answerinputs.py), which is all the steps below it are handed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from gpuslice import config
from gpuslice.webhook import annotations as annotations_
from gpuslice.webhook import (
    answerinputs,
    conversions,
    cpupods,
    dra_claims,
    foreign,
    parsing,
    patches,
    pods,
    shares,
    tolerations,
    wholegpus,
)
from gpuslice.webhook import cluster as cluster_

__all__ = ["Outcome", "mutate"]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What the webhook answers for one pod."""

    allowed: bool
    patch: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    message: str = ""  # the denial reason, else ""
    decision: dict[str, Any] | None = None  # what was converted and why (also in the decision annotation)
    warnings: tuple[str, ...] = ()  # shown by kubectl; short
    kind: str = ""  # conversion kind for metrics ("" when nothing was converted; conversions.KIND_*)
    # DRA mode: objects the webhook creates before answering (the pod's ResourceClaimTemplate).
    objects: tuple[dict[str, Any], ...] = ()
    cpu_milli: int = 0  # the CPU the converted pod asks, promised beside its units (cluster.ledger.promise_conversion)
    # The CPU the pod asks (converted and steered CPU pods): counted in cluster.cpu_demand.
    pod_cpu_milli: int = 0


_UNCHANGED = Outcome(allowed=True)

KAI_MPS = "mps"  # KAI's per-pod MPS switch: gpuslice's MPS is the cluster's choice (config.mps.enabled)


def _mps_warning(value: Any, settings: config.Config) -> str:
    if settings.mps.enabled:
        return f"gpuslice: annotation {KAI_MPS}={parsing.quote(value)} is not needed: every share runs under MPS here"
    return (
        f"gpuslice: annotation {KAI_MPS}={parsing.quote(value)} is ignored: this cluster's gpuslice runs no MPS "
        "(config.mps.enabled false), so the share's memory is accounted, not enforced (docs/isolation.md)"
    )


def mutate(pod: Mapping[str, Any], *, settings: config.Config, cluster: cluster_.ClusterView) -> Outcome:
    """Convert one pod (a Pod object as JSON) or say why it is refused. Whatever else happens, a pod
    allowed with `schedulerName: kai-scheduler` leaves with a scheduler that exists (a converted pod's
    own rewrite, else this one): once gpuslice replaces KAI, no scheduler would ever place it. The
    pod's controller is the seam's `owner` while it is converted (and after, for the
    promise): its pods take one GPU class (webhook/classchoice.py)."""
    inputs = cluster.inputs  # all the steps below read of the view (webhook/answerinputs.py)
    inputs.owner = pods.owner_of(pod.get("metadata") or {}, settings.contract)
    outcome = _mutate(pod, settings=settings, inputs=inputs)
    if outcome.allowed and outcome.decision is not None:
        mps = ((pod.get("metadata") or {}).get("annotations") or {}).get(KAI_MPS)
        if mps is not None:
            outcome = dataclasses.replace(outcome, warnings=(*outcome.warnings, _mps_warning(mps, settings)))
    spec = pod.get("spec") or {}
    if not outcome.allowed or spec.get("schedulerName") != patches.KAI_SCHEDULER or outcome.decision is not None:
        return outcome  # denied, not KAI's, or converted (patches.scheduler_ops rewrote it)
    ops, warnings = patches.scheduler_ops(spec, settings, {})
    return dataclasses.replace(outcome, patch=[*outcome.patch, *ops], warnings=(*outcome.warnings, *warnings))


def _mutate(pod: Mapping[str, Any], *, settings: config.Config, inputs: answerinputs.Inputs) -> Outcome:
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = metadata.get("annotations") or {}
    annotated = annotations_.wanted(annotations, settings.contract)
    if settings.dra.enabled and dra_claims.already_converted(pod):
        return _UNCHANGED  # DRA mode, reinvoked: the pod references its claim already
    try:
        conversion = _convert(spec, annotations, annotated, settings, inputs)
    except parsing.Invalid as denied:
        return Outcome(allowed=False, message=str(denied))
    if conversion is None:
        # Annotated but nothing to convert (already converted, container name only): leave it.
        return _UNCHANGED if annotated else _steer_cpu_pod(pod, settings, inputs)
    # The pod no longer requests nvidia.com/gpu, so Kubernetes adds no toleration for GPU taints.
    toleration_ops, added = tolerations.patch_ops(spec, settings.converted_pod_tolerations)
    if added:
        conversion.decision["tolerationsAdded"] = added
    request = conversion.steering_request
    read = request.cpu_milli if request is not None else -1  # read for the steering terms, or -1
    cpu_milli, pod_cpu_milli = max(0, read), (read if read >= 0 else pods.cpu_requested(spec))
    if settings.dra.enabled:  # DRA mode: a ResourceClaim instead of extended resources (docs/dra.md)
        classes = []
        if conversion.kind == conversions.KIND_WHOLE_GPUS and request is not None:
            gpus = request.gpus  # every class with a node of that many GPUs
            classes = [c.memory_mib for c in inputs.classes() if c.max_gpus_per_node >= gpus]
        need = dra_claims.need_from_conversion(conversion, settings.contract, pod, classes)
        claims = dra_claims.build(pod, need, settings, namespace=metadata.get("namespace") or "")
        patch = claims.patch + toleration_ops + patches.affinity_ops(pod.get("spec") or {}, conversion, settings)
        return Outcome(
            True,
            patch,
            "",
            claims.decision,
            claims.warnings,
            conversion.kind,
            (claims.template,),
            cpu_milli=cpu_milli,
            pod_cpu_milli=pod_cpu_milli,
        )
    patch, warnings = patches.build(pod, conversion, settings, pacer_absent=inputs.pacer_absent)
    return Outcome(
        allowed=True,
        patch=patch + toleration_ops,
        decision=conversion.decision,
        warnings=tuple(warnings),
        kind=conversion.kind,
        cpu_milli=cpu_milli,
        pod_cpu_milli=pod_cpu_milli,
    )


def _convert(
    spec: Mapping[str, Any],
    annotations: Mapping[str, Any],
    annotated: bool,
    settings: config.Config,
    inputs: answerinputs.Inputs,
) -> conversions.Conversion | None:
    """What the pod is converted to; None when nothing is (parsing.Invalid when it is refused)."""
    if annotated:
        # Only DRA's allocator can keep N shares on N distinct GPUs (gpu-fraction-num-devices), and
        # only a claim's prioritized list can ask for a MIG slice, else a share (mig-or-share).
        dra = settings.dra.enabled
        share = annotations_.read(spec, annotations, settings.contract, distinct_gpus=dra, alternatives=dra)
        if share is None:
            return None
        other = foreign.names_in(spec, settings.contract)
        if other:
            raise parsing.Invalid(
                f"the pod asks for a share with annotation {share.annotation} and for {', '.join(other)}: "
                f"choose one; remove {', '.join(other)} to keep the annotation's share"
            )
        return shares.convert(share, spec, settings, inputs)
    if settings.convert_whole_gpus:
        if foreign.names_in(spec, settings.contract):  # rare: one pass says whether to look closer
            hami = foreign.hami_share(spec, settings.contract)
            if hami is not None:
                conversion = shares.convert(hami, spec, settings, inputs)
                conversion.replaces = foreign.REPLACED_BY_A_SHARE
                return conversion
            mig = foreign.mig_conversion(spec, settings, inputs)
            if mig is not None:
                return mig
        return wholegpus.convert(spec, settings, inputs)
    return None


def _steer_cpu_pod(pod: Mapping[str, Any], settings: config.Config, inputs: answerinputs.Inputs) -> Outcome:
    patch = cpupods.patch(pod, settings, inputs)
    if not patch:
        return _UNCHANGED
    cpu_milli = pods.cpu_requested(pod.get("spec") or {})
    return Outcome(allowed=True, patch=patch, kind=conversions.KIND_CPU_POD, pod_cpu_milli=cpu_milli)
