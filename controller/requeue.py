"""Requeues converted pods that kubelet refused and that nothing else would recreate.

In device-plugin mode the scheduler counts a node's memory units as one pool, and the labels that
keep a share on one GPU move only after an allocation: a burst can bind more shares to a node than
its GPUs hold one by one, and kubelet refuses the excess (phase Failed, reason
UnexpectedAdmissionError). A controller's pod is replaced by its controller and placed by
then-current labels; a bare pod would be lost. This module recreates such a bare pod: the same
name, labels, annotations and spec (less the binding), after a backoff, at most `maxAttempts`
times, recorded in the pod's `<prefix>/requeues` annotation. Its resources are already converted,
so the webhook leaves the new pod alone, and the scheduler places it by the labels of that moment.

Only pods the webhook converted (they carry its decision annotation), refused at admission, with
no controller, are touched, and only by the leading controller replica (controller/leader.py); a
standby keeps the Failed pods listed and considers them all the moment it takes over. Two
replicas that both believe they lead still cannot both requeue one pod: the journal entry is
created before the delete and only one create of it succeeds, and the delete is conditional on
the refused pod's UID.

The replacement is written down (controller/requeue_journal.py) before the delete and forgotten
once it exists, so a process that dies between the delete and the create, or a create the API
server keeps refusing, loses nothing: the leader finishes such entries when it takes over and then
every `JOURNAL_SWEEP_SECONDS` (docs/steering.md, "Bursts").

May import gpuslice.{backoff,config,contract,listwatch,timeouts}, the controller's requeue_journal module
and the kubernetes client (in threads).
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Unpack

import kubernetes
import prometheus_client

from gpuslice import backoff, config, listwatch, timeouts
from gpuslice import contract as contract_
from gpuslice.controller import requeue_journal

__all__ = ["Requeuer", "replacement", "requeueable"]

log = logging.getLogger(__name__)

_METADATA_KEPT = ("name", "namespace", "labels", "annotations", "finalizers")
_CREATE_ATTEMPTS = 8
_CREATE_FIRST_RETRY_SECONDS = 0.2  # then doubling, at most _CREATE_MAX_RETRY_SECONDS
_CREATE_MAX_RETRY_SECONDS = 10.0
JOURNAL_SWEEP_SECONDS = 60.0  # how often unfinished journal entries are looked at
_RECOVERED_MESSAGE = (
    "recreated from gpuslice's requeue journal: kubelet refused an earlier pod of this name and the requeue"
    " that deleted it did not finish (the webhook stopped, or the API server refused the create for a while)"
)


def requeues_of(pod: Mapping[str, Any], contract: contract_.Contract) -> int:
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(contract.requeues_annotation, "0")
    return int(text) if str(text).isdigit() else 0


def requeueable(pod: Mapping[str, Any], contract: contract_.Contract, max_attempts: int) -> bool:
    """A pod we converted, refused by kubelet at admission, that no controller will replace, not
    being deleted, with attempts left."""
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    if status.get("phase") != "Failed" or status.get("reason") != contract_.KUBELET_REFUSED_REASON:
        return False
    if metadata.get("deletionTimestamp") or contract.decision_annotation not in (metadata.get("annotations") or {}):
        return False
    if any(isinstance(o, Mapping) and o.get("controller") for o in metadata.get("ownerReferences") or ()):
        return False
    return requeues_of(pod, contract) < max_attempts


def replacement(pod: Mapping[str, Any], contract: contract_.Contract, *, paced: bool = False) -> dict[str, Any]:
    """The pod to create in place of a refused one: its identity and spec, unbound, one more requeue;
    `paced` (pacing on and a pacer alive): gated for the pacer like a new pod, since the webhook
    leaves a pod whose resources are converted already alone."""
    metadata = pod.get("metadata") or {}
    kept = {key: copy.deepcopy(metadata[key]) for key in _METADATA_KEPT if metadata.get(key)}
    annotations = kept.setdefault("annotations", {})
    annotations[contract.requeues_annotation] = str(requeues_of(pod, contract) + 1)
    spec = copy.deepcopy(dict(pod.get("spec") or {}))
    spec.pop("nodeName", None)
    gates = [g for g in spec.get("schedulingGates") or () if isinstance(g, Mapping)]
    if paced and not any(g.get("name") == contract.pacing_gate for g in gates):
        spec["schedulingGates"] = [*gates, {"name": contract.pacing_gate}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": kept, "spec": spec}


class Requeuer:
    """Watches Failed pods cluster-wide and, while `set_leading(True)`, requeues the requeueable
    ones. `run()` until cancelled."""

    def __init__(
        self,
        api: kubernetes.client.CoreV1Api,
        settings: config.Config,
        *,
        registry: prometheus_client.CollectorRegistry | None = None,
        watch_timeout_seconds: int = 300,
        paced: Callable[[], bool] = lambda: False,
        namespace: str = "default",
        sweep_seconds: float = JOURNAL_SWEEP_SECONDS,
        leading: bool = False,
    ) -> None:
        self.api = api
        self.journal = requeue_journal.Journal(api, namespace, settings.contract)  # in the controller's namespace
        self.sweep_seconds = sweep_seconds
        self.paced = paced  # whether a replacement is gated for the pacer (pacing on, a pacer alive)
        self.contract = settings.contract
        self.max_attempts = settings.requeue.max_attempts
        self.backoff_seconds = settings.requeue.backoff_seconds
        self._pending: set[str] = set()  # UIDs being requeued by this replica
        self._tasks: set[asyncio.Task[None]] = set()
        self.leading = leading
        self._took_over = asyncio.Event()  # set when this replica starts leading: sweep the journal now
        self.failed = _FailedPods(api, self._consider, watch_timeout_seconds=watch_timeout_seconds)
        self._requeued = prometheus_client.Counter(
            "gpuslice_controller_requeues",
            "Converted pods refused by kubelet and recreated (result: requeued, gone, error; recovered: from the"
            " journal, a requeue an earlier process left unfinished)",
            ["result"],
            registry=registry,
        )

    def set_leading(self, leading: bool) -> None:
        """Act (or stop acting). Taking over, every Failed pod listed meanwhile is considered and the
        journal swept at once: what the last leader left is finished without waiting."""
        self.leading = leading
        if leading:
            self._took_over.set()
            for pod in list(self.failed.pods.values()):
                self._consider(pod)

    async def run(self) -> None:
        sweep = asyncio.create_task(self._sweep(), name="gpuslice-requeue-journal")
        try:
            await self.failed.run()
        finally:
            sweep.cancel()
            for task in self._tasks:
                task.cancel()

    async def _sweep(self) -> None:
        """Finish the journal's unfinished requeues when this replica takes over and then every
        `sweep_seconds` while it leads. Taking over, every entry is finished, however young: the
        last leader stopped acting before the Lease could be taken (controller/leader.py), so no
        replica is between an entry's write and its delete, and a pod its crash left deleted but
        not recreated comes back now, not a minute later. (Should it act still, the entry's
        lock, the delete's UID precondition and the create's taken name keep the pod single.)"""
        unfinished_takeover = False  # a takeover's pass failed: the next pass is still one
        while True:
            # Read and cleared before the pass: a takeover while it runs wakes the next one.
            took_over = self._took_over.is_set() or unfinished_takeover
            self._took_over.clear()
            unfinished_takeover = False
            if self.leading:
                grace = 0.0 if took_over else requeue_journal.RECOVERY_GRACE_SECONDS
                try:
                    await self.finish_journal(grace_seconds=grace)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - the next pass tries again
                    log.warning("requeue journal not readable: %s", exc)
                    unfinished_takeover = took_over
            await timeouts.wait_at_most(self._took_over.wait(), self.sweep_seconds)

    async def finish_journal(
        self, *, grace_seconds: float = requeue_journal.RECOVERY_GRACE_SECONDS
    ) -> requeue_journal.Recovered:
        """One pass over the journal (`Journal.recover`); every pod made from an entry is counted
        (`recovered`) and gets an Event saying why it was made again."""
        made: list[Any] = []

        async def create(pod: dict[str, Any]) -> Any:
            created = await self._create(pod)
            if created is not None:
                made.append(created)
            return created

        try:
            return await self.journal.recover(create, busy=self._pending, grace_seconds=grace_seconds)
        finally:  # also when a later entry's handling raised: these pods exist
            self._requeued.labels("recovered").inc(len(made))
            for pod in made:
                await self._event(pod, _RECOVERED_MESSAGE)

    def _consider(self, pod: dict[str, Any]) -> None:
        uid = (pod.get("metadata") or {}).get("uid")
        if (
            not self.leading
            or not uid
            or uid in self._pending
            or not requeueable(pod, self.contract, self.max_attempts)
        ):
            return
        self._pending.add(uid)
        task = asyncio.create_task(self._requeue(pod), name=f"gpuslice-requeue-{uid}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _requeue(self, pod: dict[str, Any]) -> None:
        metadata = pod["metadata"]
        namespace, name, uid = metadata["namespace"], metadata["name"], metadata["uid"]
        attempt = requeues_of(pod, self.contract)
        try:
            # backoff_seconds x 2^attempt, uncapped (maxAttempts bounds it); the count is on the pod.
            await asyncio.sleep(backoff.Backoff(self.backoff_seconds).delay(attempt))
            fresh = replacement(pod, self.contract, paced=self.paced())
            if not await self.journal.write(uid, fresh):
                self._requeued.labels("gone").inc()  # another replica is requeueing it
                return
            try:
                await requeue_journal.delete_pod(self.api, name, namespace, uid)
            except kubernetes.client.ApiException as exc:
                await self.journal.forget(uid)  # nothing was deleted: nothing to finish
                if exc.status in (404, 409):  # gone, or the user got there first
                    self._requeued.labels("gone").inc()
                    return
                raise
            # A create that fails for good raises here and leaves the entry: the sweep retries it.
            created = await self._create(fresh)
            await self.journal.forget(uid)
            self._requeued.labels("requeued").inc()
            refusal = (pod.get("status") or {}).get("message", "")
            node = (pod.get("spec") or {}).get("nodeName", "")
            message = (
                f"kubelet on node {node} refused the pod ({refusal[:300]}); recreated with the same spec to be "
                f"placed again ({attempt + 1} of {self.max_attempts})"
            )
            log.info("pod %s/%s: %s", namespace, name, message)
            if created is not None:
                await self._event(created, message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - logged and counted; the pod stays as it was
            self._requeued.labels("error").inc()
            log.error("pod %s/%s could not be requeued: %s", namespace, name, exc)
        finally:
            self._pending.discard(uid)

    async def _create(self, pod: dict[str, Any]) -> Any:
        """Create, retrying transient failures: the refused pod is already deleted. The created pod,
        or None when the name was taken meanwhile (the user made it again)."""
        retry = backoff.Backoff(_CREATE_FIRST_RETRY_SECONDS, _CREATE_MAX_RETRY_SECONDS)
        for attempt in range(_CREATE_ATTEMPTS):
            try:
                body: Any = pod  # the client serialises a plain dict as it is
                return await asyncio.to_thread(self.api.create_namespaced_pod, pod["metadata"]["namespace"], body)
            except kubernetes.client.ApiException as exc:
                if exc.status == 409:
                    return None
                if exc.status is not None and 400 <= exc.status < 500 and exc.status != 429:
                    raise  # the API server will not take it on a retry either
                if attempt == _CREATE_ATTEMPTS - 1:
                    raise
            await asyncio.sleep(retry.next())
        return None

    async def _event(self, pod: Any, message: str) -> None:
        """A Normal event on the new pod, for `kubectl describe pod`; best effort."""
        metadata = pod.metadata
        now = datetime.datetime.now(datetime.UTC)
        event = kubernetes.client.CoreV1Event(
            metadata=kubernetes.client.V1ObjectMeta(generate_name=f"{metadata.name}.", namespace=metadata.namespace),
            involved_object=kubernetes.client.V1ObjectReference(
                api_version="v1", kind="Pod", name=metadata.name, namespace=metadata.namespace, uid=metadata.uid
            ),
            reason="Requeued",
            message=message,
            type="Normal",
            source=kubernetes.client.V1EventSource(component="gpuslice-controller"),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        try:
            await asyncio.to_thread(self.api.create_namespaced_event, metadata.namespace, event)
        except kubernetes.client.ApiException as exc:
            log.warning("no event for requeued pod %s/%s: %s", metadata.namespace, metadata.name, exc.reason)


class _FailedPods(listwatch.PodWatch):
    """The cluster's Failed pods (field selector status.phase=Failed), kept by UID for a replica that
    takes over, each handed to `consider` when listed and when it changes; a list after a restart
    or a 410 shows every one again."""

    def __init__(
        self,
        api: kubernetes.client.CoreV1Api,
        consider: Callable[[dict[str, Any]], None],
        **options: Unpack[listwatch.Options],
    ) -> None:
        super().__init__(lambda: api, "refused pods", "status.phase=Failed", stream_lists=True, **options)
        self._consider = consider
        self.pods: dict[str, dict[str, Any]] = {}

    def keep(self, obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """Pods kubelet refused (a Failed pod's reason does not change), whole but for their managed
        fields: a requeue recreates the pod from its spec. Other Failed pods (a cluster may keep
        thousands of finished Jobs' pods) are never requeued."""
        if (obj.get("status") or {}).get("reason") != contract_.KUBELET_REFUSED_REASON:
            return None
        metadata = obj.get("metadata") or {}
        return {**obj, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}

    def replace(self, items: Sequence[Mapping[str, Any]]) -> None:
        self.pods = {_uid(pod): dict(pod) for pod in items}
        for pod in list(self.pods.values()):
            self._consider(pod)

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "DELETED":  # deleted, or no longer Failed
            self.pods.pop(_uid(obj), None)
        elif kind in ("ADDED", "MODIFIED"):
            pod = self.pods[_uid(obj)] = dict(obj)
            self._consider(pod)


def _uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")
