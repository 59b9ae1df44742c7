"""Node affinity that steers a converted pod (issue 6): required terms so the pod is only
considered for nodes where it fits on one GPU (or where enough whole GPUs are free), and
preferred terms that make even the default scheduler pack.

Pure functions over the contract's label keys; the mutation calls `placement_affinity` when
`steering.enabled` and merges the result into the pod's affinity.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gpuslice import contract as contract_

__all__ = ["Request", "placement_affinity"]


@dataclasses.dataclass(frozen=True)
class Request:
    """What the webhook converted the pod to."""

    units: int = 0  # gpu-memory units per GPU (0 for MIG)
    gpus: int = 1  # >1 only for whole GPUs
    whole_gpus: bool = False
    mig_profile: str | None = None  # resource-form profile for MIG isolation
    units_per_gpu: int = 0  # units of one GPU of the class the pod is pinned to (0: unknown)


def placement_affinity(
    request: Request, contract: contract_.Contract
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(required matchExpressions, preferred scheduling terms) for the pod's node affinity.

    Required expressions are ANDed into every existing required nodeSelectorTerm (or form one);
    preferred terms are appended to preferredDuringSchedulingIgnoredDuringExecution.
    """
    if request.mig_profile:
        required = [{"key": contract.label_mig_free(request.mig_profile), "operator": "Gt", "values": ["0"]}]
        return required, []
    if request.whole_gpus:
        required = [{"key": contract.label_free_gpus, "operator": "Gt", "values": [str(request.gpus - 1)]}]
        return required, []
    required = [{"key": contract.label_free_block_units, "operator": "Gt", "values": [str(request.units - 1)]}]
    return required, []
