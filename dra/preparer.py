"""NodePrepareResources and NodeUnprepareResources, without gRPC: idempotent and crash-safe.

Prepare, per claim (claims of one call run concurrently; calls for one claim one at a time):
  1. recorded as completed in the checkpoint -> answer what was recorded (idempotent);
  2. read the ResourceClaim from the API server (kubelet names it only), check its UID, keep the
     results of this driver on this node, and build the CDI spec;
  3. refuse if the shares would give a GPU more than it holds beside the claims already
     prepared (the scheduler guarantees it; a stale claim delays a new one instead of overlapping);
  4. record "started" -> write the CDI spec -> record "completed" -> answer.
Unprepare, per claim: remove the CDI spec, then the record; an unknown claim is already done.

A crash between any two steps leaves a state the next call finishes (checkpoint.py explains
why). `crash_hook(step)` is called after each durable step ("started", "cdi-written",
"cdi-removed") so tests can stop the process exactly there.

May import gpuslice.{config,contract}, gpuslice.node.inventory and gpuslice.dra's
shares, cdi and checkpoint.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from gpuslice import config as config_
from gpuslice.dra import cdi, checkpoint, shares
from gpuslice.node import inventory

__all__ = ["ClaimApi", "ClaimApiError", "ClaimNotFound", "ClaimRef", "Preparer", "Result"]

log = logging.getLogger(__name__)


class ClaimApiError(RuntimeError):
    """The API server could not be asked (the message says which claim and why)."""


class ClaimNotFound(ClaimApiError):
    """The ResourceClaim does not exist (any more)."""


class ClaimApi(Protocol):
    async def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        """The ResourceClaim as JSON; ClaimNotFound or ClaimApiError."""


@dataclasses.dataclass(frozen=True)
class ClaimRef:
    """A claim as kubelet names it."""

    namespace: str
    uid: str
    name: str


@dataclasses.dataclass(frozen=True)
class Result:
    devices: tuple[checkpoint.PreparedDevice, ...] = ()
    error: str = ""


class Preparer:
    """Prepares and unprepares the claims of one node."""

    def __init__(
        self,
        *,
        node: inventory.NodeInventory,
        settings: config_.Config,
        pool: str,
        api: ClaimApi,
        state: checkpoint.Checkpoint,
        cdi_dir: str | os.PathLike[str],
        crash_hook: Callable[[str], None] | None = None,
    ) -> None:
        self.node = node
        self.settings = settings
        self.contract = settings.contract
        self.pool = pool
        self.api = api
        self.checkpoint = state
        self.cdi_dir = cdi_dir
        self._crash_hook = crash_hook or (lambda step: None)
        self._claim_locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        self._state_lock = asyncio.Lock()  # checkpoint reads-then-writes happen under it
        self.listeners: list[Callable[[], None]] = []  # called after every change (metrics, labels)

    # --- start-up ----------------------------------------------------------------------------

    def recover(self) -> list[str]:
        """Load the checkpoint and delete this driver's CDI specs of claims it does not record
        (left by a lost checkpoint or a claim whose unprepare finished only half). Returns the
        removed file names. CheckpointError when the checkpoint cannot be trusted."""
        claims = self.checkpoint.load()
        kept = {c.spec_file for c in claims.values()}
        removed = []
        for uid, file_name in cdi.list_claim_files(self.cdi_dir, self.contract).items():
            if file_name not in kept:
                cdi.remove_spec(self.cdi_dir, file_name)
                removed.append(file_name)
                log.warning("removed CDI spec %s of claim %s: no prepared claim records it", file_name, uid)
        started = sorted(c.uid for c in claims.values() if c.state == checkpoint.STARTED)
        if started:
            log.warning("claims whose prepare was interrupted (kubelet will re-send them): %s", ", ".join(started))
        return removed

    def prepared_shares(self) -> Iterator[shares.Share]:
        for claim in self.checkpoint.claims.values():
            yield from claim.shares

    # --- the two calls -----------------------------------------------------------------------

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, Result]:
        results = await asyncio.gather(*(self._prepare_one(c) for c in claims))
        return {claim.uid: result for claim, result in zip(claims, results, strict=True)}

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Claim UID -> error ("" when done)."""
        results = await asyncio.gather(*(self._unprepare_one(c) for c in claims))
        return {claim.uid: error for claim, error in zip(claims, results, strict=True)}

    async def _prepare_one(self, ref: ClaimRef) -> Result:
        where = f"ResourceClaim {ref.namespace}/{ref.name} ({ref.uid})"
        if not (ref.namespace and ref.name and ref.uid):
            return Result(error=f"{where}: kubelet must name the claim's namespace, name and UID")
        try:
            async with self._claim_lock(ref.uid):
                return await self._prepare_locked(ref, where)
        except (shares.ShareError, ClaimApiError) as exc:
            log.warning("prepare %s: %s", where, exc)
            return Result(error=str(exc))
        except OSError as exc:  # the CDI directory or checkpoint could not be written
            log.error("prepare %s: %s", where, exc)
            return Result(error=f"{where}: writing the CDI spec or checkpoint failed: {exc}")

    async def _prepare_locked(self, ref: ClaimRef, where: str) -> Result:
        recorded = self.checkpoint.claims.get(ref.uid)
        if recorded is not None and recorded.state == checkpoint.COMPLETED:
            return Result(devices=recorded.devices)
        try:
            claim = await self.api.get_claim(ref.namespace, ref.name)
        except ClaimNotFound:
            raise ClaimApiError(f"{where} was not found in the API server") from None
        uid = (claim.get("metadata") or {}).get("uid")
        if uid != ref.uid:
            raise shares.ShareError(f"{where}: the API server has a claim of that name with UID {uid}, not {ref.uid}")
        allocated = shares.allocated_shares(claim, self.node, self.contract, self.pool)
        grants = shares.grants(allocated, self.node, self.contract)
        spec = cdi.claim_spec(self.contract, ref.uid, grants, self.settings)
        devices = tuple(self._devices(allocated, spec.ids))
        spec_file = cdi.spec_file_name(self.contract, ref.uid)
        entry = checkpoint.PreparedClaim(
            uid=ref.uid,
            namespace=ref.namespace,
            name=ref.name,
            state=checkpoint.STARTED,
            devices=devices,
            shares=tuple(allocated),
            spec_file=spec_file,
        )
        async with self._state_lock:
            others = [s for c in self.checkpoint.claims.values() if c.uid != ref.uid for s in c.shares]
            problem = shares.overcommitted(others, allocated, self.node, self.contract)
            if problem:
                raise shares.ShareError(f"{where}: {problem}")
            self.checkpoint.put(entry)
        self._crash_hook("started")
        cdi.write_spec(self.cdi_dir, spec_file, spec.document)
        self._crash_hook("cdi-written")
        async with self._state_lock:
            self.checkpoint.put(dataclasses.replace(entry, state=checkpoint.COMPLETED))
        self._notify()
        log.info("prepared %s: %s", where, ", ".join(f"{s.device} {s.memory_mib} MiB" for s in allocated))
        return Result(devices=devices)

    def _devices(
        self, allocated: Sequence[shares.Share], ids: Mapping[str, list[str]]
    ) -> Iterator[checkpoint.PreparedDevice]:
        """One answer device per share; a request's CDI devices go on its first device only (the
        runtime gets each CDI device once, whichever of the request's devices carries it)."""
        given: set[str] = set()
        for share in allocated:
            first = share.request not in given
            given.add(share.request)
            yield checkpoint.PreparedDevice(
                requests=(share.request,),
                pool=self.pool,
                device=share.device,
                share_id=share.share_id,
                cdi_ids=tuple(ids.get(share.request, ())) if first else (),
            )

    async def _unprepare_one(self, ref: ClaimRef) -> str:
        where = f"ResourceClaim {ref.namespace}/{ref.name} ({ref.uid})"
        try:
            async with self._claim_lock(ref.uid):
                async with self._state_lock:
                    recorded = self.checkpoint.claims.get(ref.uid)
                    try:
                        spec_file = recorded.spec_file if recorded else cdi.spec_file_name(self.contract, ref.uid)
                    except ValueError as exc:  # not a UID: nothing of ours can carry it
                        return f"{where}: {exc}"
                    cdi.remove_spec(self.cdi_dir, spec_file)
                    self._crash_hook("cdi-removed")
                    if self.checkpoint.remove(ref.uid):
                        log.info("unprepared %s", where)
        except OSError as exc:
            log.error("unprepare %s: %s", where, exc)
            return f"{where}: removing the CDI spec or updating the checkpoint failed: {exc}"
        self._notify()
        return ""

    def _claim_lock(self, uid: str) -> _ClaimLock:
        return _ClaimLock(self._claim_locks, uid)

    def _notify(self) -> None:
        for listener in self.listeners:
            listener()


class _ClaimLock:
    """An asyncio.Lock per claim UID, dropped once nobody holds or waits for it."""

    def __init__(self, locks: dict[str, tuple[asyncio.Lock, list[int]]], uid: str) -> None:
        self._locks = locks
        self._uid = uid

    async def __aenter__(self) -> None:
        lock, users = self._locks.setdefault(self._uid, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            await lock.acquire()
        except BaseException:
            self._leave(users)
            raise

    async def __aexit__(self, *exc: object) -> None:
        lock, users = self._locks[self._uid]
        lock.release()
        self._leave(users)

    def _leave(self, users: list[int]) -> None:
        users[0] -= 1
        if users[0] == 0:
            del self._locks[self._uid]
