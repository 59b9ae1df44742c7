"""The record of prepared claims, kept in one JSON file so a restart neither forgets nor doubles one.

Each claim is recorded in one of two states:
  "started"    the plugin decided what the claim gets and may have written its CDI spec;
  "completed"  its CDI spec is written and kubelet has (or will have) been answered.
Preparing records "started" before touching the CDI directory and "completed" after, so after a
crash at any point the record says everything there may be on disk: a re-sent
NodePrepareResources finishes a started claim, NodeUnprepareResources removes it either way.
The shares of a started claim count against its GPUs until then, so nothing can be given twice.

The file holds a version, the driver name, a SHA-256 of the claims and the claims themselves;
it is written to a temporary file, fsync'ed and renamed, so it is always the old or the new one.
A file that cannot be read (corrupt, another driver's, a future version) raises CheckpointError:
the plugin refuses to start rather than forget what it prepared.

May import gpuslice.dra.shares (the Share record); no other gpuslice module.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
from collections.abc import Mapping
from typing import Any

from gpuslice.dra import shares as shares_

__all__ = ["COMPLETED", "STARTED", "Checkpoint", "CheckpointError", "PreparedClaim", "PreparedDevice"]

VERSION = "gpuslice.dra/v1"
STARTED = "started"
COMPLETED = "completed"


class CheckpointError(RuntimeError):
    """The checkpoint file exists but cannot be trusted; the message names the file and why."""


@dataclasses.dataclass(frozen=True)
class PreparedDevice:
    """One device of a NodePrepareResources answer."""

    requests: tuple[str, ...]
    pool: str
    device: str
    share_id: str | None
    cdi_ids: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    state: str
    devices: tuple[PreparedDevice, ...]
    shares: tuple[shares_.Share, ...]
    spec_file: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PreparedClaim:
        return cls(
            uid=data["uid"],
            namespace=data["namespace"],
            name=data["name"],
            state=data["state"],
            devices=tuple(
                PreparedDevice(
                    requests=tuple(d["requests"]),
                    pool=d["pool"],
                    device=d["device"],
                    share_id=d["share_id"],
                    cdi_ids=tuple(d["cdi_ids"]),
                )
                for d in data["devices"]
            ),
            shares=tuple(shares_.Share(**s) for s in data["shares"]),
            spec_file=data["spec_file"],
        )


def _digest(claims: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).hexdigest()


class Checkpoint:
    """The prepared claims by UID, loaded once and saved after every change."""

    def __init__(self, path: str | os.PathLike[str], driver: str) -> None:
        self.path = pathlib.Path(path)
        self.driver = driver
        self.claims: dict[str, PreparedClaim] = {}

    def load(self) -> dict[str, PreparedClaim]:
        """Read the file (no file: nothing prepared yet). CheckpointError when it is unusable."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            self.claims = {}
            return self.claims
        except OSError as exc:
            raise CheckpointError(f"checkpoint {self.path}: cannot read it: {exc.strerror}") from None
        try:
            document = json.loads(text)
            if document.get("version") != VERSION:
                raise CheckpointError(
                    f"checkpoint {self.path}: version {document.get('version')!r}, this plugin reads {VERSION!r}"
                )
            if document.get("driver") != self.driver:
                raise CheckpointError(
                    f"checkpoint {self.path} belongs to driver {document.get('driver')!r}, not {self.driver!r}"
                )
            raw = document["claims"]
            if document.get("sha256") != _digest(raw):
                raise CheckpointError(f"checkpoint {self.path}: checksum mismatch (the file was changed or damaged)")
            self.claims = {uid: PreparedClaim.from_json(entry) for uid, entry in raw.items()}
        except CheckpointError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"checkpoint {self.path} is damaged: {type(exc).__name__}: {exc}") from None
        return self.claims

    def save(self) -> None:
        """Write every claim atomically: temporary file, fsync, rename, fsync of the directory."""
        raw = {uid: claim.to_json() for uid, claim in sorted(self.claims.items())}
        document = {"version": VERSION, "driver": self.driver, "sha256": _digest(raw), "claims": raw}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.tmp")
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(document, handle, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)
        descriptor = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)

    def put(self, claim: PreparedClaim) -> None:
        self.claims[claim.uid] = claim
        self.save()

    def remove(self, uid: str) -> bool:
        if uid not in self.claims:
            return False
        del self.claims[uid]
        self.save()
        return True
