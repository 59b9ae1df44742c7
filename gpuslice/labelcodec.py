"""The values of the node labels gpuslice publishes, written and read in one place: the device
plugin (and the DRA plugin, and the simulator's nodes) write them through `count_value` and
`mig_memory_labels`; the webhook, the pacer and the plugin's own diff read them back through
`count_of`, `read_count` and `mig_memory_of`. The keys are gpuslice.contract's.

Every value the plugin publishes beside the product name is a whole number of 0 or more, at most
MAX_COUNT_DIGITS digits, in ASCII digits: int() would also take "１２", "1_0", " 12" and "-3",
which no plugin writes, so a reader refuses them (`Malformed`) rather than guess. What a reader
does with a refused value is its own policy: the webhook distrusts the node, the pacer counts
nothing free.

May import gpuslice.{contract,messages} only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpuslice import contract as contract_
from gpuslice import messages

__all__ = [
    "MAX_COUNT_DIGITS",
    "Malformed",
    "count_of",
    "count_value",
    "mig_memory_labels",
    "mig_memory_of",
    "read_count",
]

MAX_COUNT_DIGITS = 12  # no count gpuslice publishes comes near: 10**12 MiB is an exbibyte
_COUNT_RE = re.compile(rf"[0-9]{{1,{MAX_COUNT_DIGITS}}}", re.ASCII)


class Malformed(ValueError):
    """A label's value is not a count as the plugin writes one; the message names the label."""


def count_value(count: int) -> str:
    """The label value of a count. ValueError for a negative count or one of more than
    MAX_COUNT_DIGITS digits: the API server refuses the first, every reader the second."""
    text = str(count)
    if count < 0 or len(text) > MAX_COUNT_DIGITS:
        raise ValueError(f"{count} cannot be published as a count label (0 to {MAX_COUNT_DIGITS} digits)")
    return text


def count_of(key: str, value: Any) -> int:
    """The count in label `key`'s `value`; Malformed when it is not one `count_value` writes."""
    if not isinstance(value, str) or not _COUNT_RE.fullmatch(value):
        raise Malformed(f"label {key}={messages.quote(value)} is not a whole number")
    return int(value)


def read_count(labels: Mapping[str, Any], key: str) -> int | None:
    """The count in `labels[key]`; None when the node has no such label; Malformed when its
    value is not a count."""
    value = labels.get(key)
    return None if value is None else count_of(key, value)


def mig_memory_labels(contract: contract_.Contract, memory_by_profile: Mapping[str, int]) -> dict[str, str]:
    """The labels that give the memory (MiB) of one MIG device of each profile."""
    return {contract.label_mig_memory(profile): count_value(mib) for profile, mib in memory_by_profile.items()}


def mig_memory_of(labels: Mapping[str, Any], contract: contract_.Contract) -> dict[str, int]:
    """MiB of one MIG device per resource-form profile, from the labels `mig_memory_labels`
    writes; Malformed when one is not a count (even one that names no profile, and is left out)."""
    head, tail = f"{contract.prefix}/mig.", ".memory-mib"
    memory = {}
    for key in labels:
        if key.startswith(head) and key.endswith(tail):
            mib = count_of(key, labels[key])
            profile = key[len(head) : -len(tail)]
            if profile:
                memory[profile] = mib
    return memory
