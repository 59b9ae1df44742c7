"""Kubelet's device manager record for one extended resource on one node: pure, synchronous,
no I/O. The gRPC kubelet emulator (sim/kubelet.py) and the packing simulator both keep their
devices here, so both allocate exactly the way kubelet does.

It follows kubelet's devicesToAllocate (pkg/kubelet/cm/devicemanager, see
../shared/reference/deviceplugin-api.md):

1. refuse if the resource has no healthy device at all;
2. take reusable devices first (devices of the pod's init containers that are still healthy);
3. refuse if fewer healthy, unallocated devices than still needed remain;
4. ask the plugin (GetPreferredAllocation) with available = free ∪ reused and
   must_include = reused, allocation_size = the full request;
5. keep the answer's IDs that are really available (in sorted order, as kubelet does);
6. fill any shortfall with arbitrary available devices (sorted IDs).

The preferred answer is advice only: kubelet never refuses because the plugin answered short.
Imports nothing from gpuslice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

__all__ = ["AdmissionError", "ResourceDevices"]


class AdmissionError(Exception):
    """Kubelet would fail the pod (UnexpectedAdmissionError): the message says why."""


def _pod_of(owner: str) -> str:
    """'ns/pod/container' -> 'ns/pod': containers of one pod may reuse each other's devices."""
    head, sep, _ = owner.rpartition("/")
    return head if sep and "/" in head else owner


class ResourceDevices:
    """The devices kubelet knows for one resource: their health and who holds them."""

    def __init__(self, resource: str, device_ids: Iterable[str] = ()) -> None:
        self.resource = resource
        self.healthy: set[str] = set(device_ids)
        self.unhealthy: set[str] = set()
        # owner key ("ns/pod/container") -> device IDs, in the order they were committed
        self.allocated: dict[str, tuple[str, ...]] = {}
        self._holder: dict[str, str] = {}  # device ID -> owner

    # --- ListAndWatch -------------------------------------------------------------------

    def update(self, devices: Mapping[str, bool]) -> None:
        """A ListAndWatch message: every device the plugin has now, id -> healthy.

        Devices that disappear stay allocated to their owners (running containers keep them),
        but can no longer be handed out.
        """
        self.healthy = {d for d, ok in devices.items() if ok}
        self.unhealthy = {d for d, ok in devices.items() if not ok}

    def mark_all_unhealthy(self) -> None:
        """The plugin went away: kubelet treats its devices as unhealthy (allocatable 0)."""
        self.unhealthy |= self.healthy
        self.healthy = set()

    @property
    def capacity(self) -> int:
        return len(self.healthy) + len(self.unhealthy)

    @property
    def allocatable(self) -> int:
        return len(self.healthy)

    def holder(self, device_id: str) -> str | None:
        return self._holder.get(device_id)

    def available(self) -> list[str]:
        """Healthy devices no one holds, sorted (kubelet iterates its sets sorted)."""
        holder = self._holder
        return sorted(d for d in self.healthy if d not in holder)

    # --- devicesToAllocate --------------------------------------------------------------

    def _reused(self, size: int, reusable: Sequence[str]) -> list[str]:
        return sorted(d for d in set(reusable) if d in self.healthy)[:size]

    def preferred_request(self, size: int, reusable: Sequence[str] = ()) -> tuple[list[str], list[str]]:
        """(available_deviceIDs, must_include_deviceIDs) for GetPreferredAllocation.

        Raises AdmissionError with kubelet's reasons when the request cannot be met.
        """
        if size <= 0:
            raise AdmissionError(f"{self.resource}: request size must be positive, got {size}")
        if not self.healthy:
            raise AdmissionError(f"no healthy devices present; cannot allocate unhealthy devices {self.resource}")
        reused = self._reused(size, reusable)
        needed = size - len(reused)
        free = self.available()
        if needed > len(free):
            raise AdmissionError(
                f"requested number of devices unavailable for {self.resource}. "
                f"Requested: {needed}, Available: {len(free)}"
            )
        if not reused:
            return free, []
        return sorted({*free, *reused}), reused

    def choose(self, size: int, preferred: Sequence[str], reusable: Sequence[str] = ()) -> list[str]:
        """The devices kubelet allocates: reused ones, then the preferred answer's IDs that are
        available, then arbitrary available IDs if still short."""
        chosen = self._reused(size, reusable)
        taken = set(chosen)
        holder = self._holder

        def fill(candidates: Iterable[str]) -> bool:
            for device_id in candidates:
                if len(chosen) >= size:
                    return True
                if device_id in taken or device_id not in self.healthy or device_id in holder:
                    continue
                chosen.append(device_id)
                taken.add(device_id)
            return len(chosen) >= size

        if fill(sorted(set(preferred))) or fill(self.available()):
            return chosen
        raise AdmissionError(
            f"requested number of devices unavailable for {self.resource}. Requested: {size}, Available: {len(chosen)}"
        )

    # --- bookkeeping --------------------------------------------------------------------

    def commit(self, owner: str, device_ids: Sequence[str]) -> None:
        """Record that `owner` holds `device_ids` (after a successful Allocate).

        A device may be shared only between containers of the same pod (reused init-container
        devices); anything else would be an overcommit and is refused.
        """
        if owner in self.allocated:
            raise AdmissionError(f"{self.resource}: {owner} already holds devices")
        pod = _pod_of(owner)
        for device_id in device_ids:
            other = self._holder.get(device_id)
            if other is not None and _pod_of(other) != pod:
                raise AdmissionError(f"{self.resource}: device {device_id} is already allocated to {other}")
            if device_id not in self.healthy and device_id not in self.unhealthy:
                raise AdmissionError(f"{self.resource}: unknown device {device_id}")
        self.allocated[owner] = tuple(device_ids)
        for device_id in device_ids:
            self._holder.setdefault(device_id, owner)

    def release(self, owner: str) -> list[str]:
        """Forget `owner`'s devices (its pod ended); returns them ([] if it held none)."""
        device_ids = list(self.allocated.pop(owner, ()))
        pod = _pod_of(owner)
        # another container of the same pod may still hold a reused device
        siblings = [(other, set(ids)) for other, ids in self.allocated.items() if _pod_of(other) == pod]
        for device_id in device_ids:
            if self._holder.get(device_id) == owner:
                del self._holder[device_id]
                for other, ids in siblings:
                    if device_id in ids:
                        self._holder[device_id] = other
                        break
        return device_ids
