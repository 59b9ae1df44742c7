"""The requeuer's journal: a refused pod's replacement is written down before the pod is deleted,
so that nothing the requeuer does can lose it.

Requeueing deletes the refused pod and creates it again under its name. Without a record, the pod
would be gone if the controller died between the two calls, or if the create kept failing (the
API server down longer than the retries, a ResourceQuota another pod took meanwhile). Each
replacement is therefore kept in a ConfigMap in the controller's own namespace (one per refused
pod, named after its UID, labelled `<prefix>/requeue-journal`) from before the delete until the
replacement exists. The leading controller replica, when it takes over and then periodically,
finishes what an entry records (`Journal.recover`): creates the pod when no pod has its name
(deleting the refused pod first when its requeuer died before doing so), and forgets the entry
once another pod has it. Entries written by the webhook before the controller existed (chart
0.1.0) have the same shape and are finished the same way.

An entry's name doubles as the lock between replicas: only the replica whose create of it succeeds
goes on to delete the pod.

May import gpuslice.contract and the kubernetes client (in threads).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import logging
from collections.abc import Callable, Collection, Mapping
from typing import Any

import kubernetes

from gpuslice import contract as contract_

__all__ = ["Entry", "Journal", "Recovered", "delete_pod"]

log = logging.getLogger(__name__)

_POD_KEY = "pod.json"
_UID_KEY = "uid"
# An entry younger than this may belong to a replica between its journal write and its delete.
RECOVERY_GRACE_SECONDS = 60.0


@dataclasses.dataclass(frozen=True)
class Entry:
    """One replacement written down: the refused pod's UID, the pod to create, when it was written."""

    uid: str
    pod: dict[str, Any]
    written: datetime.datetime | None

    @property
    def namespace(self) -> str:
        return str(self.pod["metadata"]["namespace"])

    @property
    def pod_name(self) -> str:
        return str(self.pod["metadata"]["name"])


@dataclasses.dataclass
class Recovered:
    """What one pass over the journal did."""

    created: list[str] = dataclasses.field(default_factory=list)  # namespace/name of pods made from entries
    forgotten: int = 0  # entries whose pod exists (the replacement, or the user's own)
    waiting: int = 0  # entries left for a later pass (young, the pod still terminating, or the create failed)


class Journal:
    """The journal's entries in `namespace`, through the CoreV1 API."""

    def __init__(self, api: kubernetes.client.CoreV1Api, namespace: str, contract: contract_.Contract) -> None:
        self.api = api
        self.namespace = namespace
        self.label = f"{contract.prefix}/requeue-journal"
        self._name_prefix = f"{contract.prefix.split('.')[0]}-requeue-"

    def entry_name(self, uid: str) -> str:
        return f"{self._name_prefix}{uid}"[:253]

    async def write(self, uid: str, pod: Mapping[str, Any]) -> bool:
        """Write down the replacement of the refused pod `uid`; False when an entry exists already
        (another replica is requeueing it). API errors other than that raise."""
        metadata = pod["metadata"]
        body = kubernetes.client.V1ConfigMap(
            metadata=kubernetes.client.V1ObjectMeta(
                name=self.entry_name(uid),
                namespace=self.namespace,
                labels={self.label: "v1"},
                annotations={self.label: f"{metadata['namespace']}/{metadata['name']}"},
            ),
            data={_UID_KEY: uid, _POD_KEY: json.dumps(pod, separators=(",", ":"))},
        )
        try:
            await asyncio.to_thread(self.api.create_namespaced_config_map, self.namespace, body)
        except kubernetes.client.ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    async def forget(self, uid: str) -> None:
        """Drop the entry of refused pod `uid` (gone already is fine)."""
        try:
            await asyncio.to_thread(self.api.delete_namespaced_config_map, self.entry_name(uid), self.namespace)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise

    async def entries(self) -> list[Entry]:
        """The entries written down; one that cannot be read is logged and left alone."""
        listed: Any = await asyncio.to_thread(
            self.api.list_namespaced_config_map, self.namespace, label_selector=self.label
        )
        out = []
        for item in listed.items:
            data = item.data or {}
            try:
                pod = json.loads(data[_POD_KEY])
                pod["metadata"]["namespace"], pod["metadata"]["name"]  # noqa: B018 - what recovery reads
                out.append(Entry(str(data[_UID_KEY]), pod, item.metadata.creation_timestamp))
            except (KeyError, TypeError, ValueError) as exc:
                log.error(
                    "requeue journal entry %s/%s is unreadable (%r); left alone",
                    self.namespace,
                    item.metadata.name,
                    exc,
                )
        return out

    async def recover(
        self,
        create: Callable[[dict[str, Any]], Any],
        *,
        busy: Collection[str] = (),
        now: datetime.datetime | None = None,
        grace_seconds: float = RECOVERY_GRACE_SECONDS,
    ) -> Recovered:
        """Finish every entry not in `busy` (UIDs this replica is requeueing) and older than
        `grace_seconds`: `await create(pod)` where no pod has its name any more (`create` gives
        None when the name was taken meanwhile and raises when the API server refuses), then forget
        it; forget it where another pod has the name (the replacement, or one the user made). Where
        the refused pod itself is still there (the requeuer died before its delete), delete it by
        its UID and create the replacement, finishing what the entry began."""
        now = now or datetime.datetime.now(datetime.UTC)
        done = Recovered()
        for entry in await self.entries():
            age = (now - entry.written).total_seconds() if entry.written is not None else grace_seconds
            if entry.uid in busy or age < grace_seconds:
                done.waiting += 1
                continue
            try:
                existing: Any = await asyncio.to_thread(self.api.read_namespaced_pod, entry.pod_name, entry.namespace)
            except kubernetes.client.ApiException as exc:
                if exc.status != 404:
                    log.warning("requeue journal: %s/%s not readable: %s", entry.namespace, entry.pod_name, exc.reason)
                    done.waiting += 1
                    continue
                existing = None
            if existing is not None and existing.metadata.uid == entry.uid:
                if existing.metadata.deletion_timestamp is not None or not await self._delete_refused(entry):
                    done.waiting += 1  # being deleted (finalizers still to run): create once it is gone
                    continue
            elif existing is not None:
                await self.forget(entry.uid)  # the replacement, or the user's own pod
                done.forgotten += 1
                continue
            try:
                made = await create(entry.pod)
            except kubernetes.client.ApiException as exc:
                log.error(
                    "requeue journal: %s/%s not created (%s); kept for the next pass",
                    entry.namespace,
                    entry.pod_name,
                    exc.reason,
                )
                done.waiting += 1
                continue
            await self.forget(entry.uid)
            if made is None:  # the name was taken meanwhile
                done.forgotten += 1
                continue
            done.created.append(f"{entry.namespace}/{entry.pod_name}")
            log.info(
                "requeue journal: recreated %s/%s, whose requeue had not finished", entry.namespace, entry.pod_name
            )
        return done

    async def _delete_refused(self, entry: Entry) -> bool:
        """The refused pod is still there: the requeuer that wrote the entry died before its delete.
        Delete it (only that pod, by UID), so the entry can be finished; whether it is gone."""
        try:
            await delete_pod(self.api, entry.pod_name, entry.namespace, entry.uid)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:  # 409: another pod has the name now; the next pass forgets the entry
                log.warning("requeue journal: %s/%s not deleted: %s", entry.namespace, entry.pod_name, exc.reason)
                return False
        return True


async def delete_pod(api: kubernetes.client.CoreV1Api, name: str, namespace: str, uid: str) -> None:
    """Delete pod `namespace`/`name` only while it is the pod `uid` (409 once another pod has the
    name, 404 once it is gone): no requeue ever deletes a pod it did not mean."""
    await asyncio.to_thread(
        api.delete_namespaced_pod,
        name,
        namespace,
        body=kubernetes.client.V1DeleteOptions(preconditions=kubernetes.client.V1Preconditions(uid=uid)),
    )
