"""The decision annotation (`<prefix>/decision`): what was converted and why, as sorted JSON,
kept within what the API server accepts.

Kubernetes refuses an object whose annotations (keys plus values, in bytes) exceed 256 KiB, after
the webhooks have run: a pod that arrives close to the limit must not be pushed over it by the
webhook, or the user sees a refusal about annotations they never wrote. So the decision is cut
to its essentials when it is long, and left out (with a warning) when even that does not fit.

Pure. May import orjson only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

__all__ = ["MAX_BYTES", "TOTAL_ANNOTATION_BYTES", "patch_ops"]

# apimachinery's TotalAnnotationSizeLimitB: keys plus values of one object.
TOTAL_ANNOTATION_BYTES = 256 * 1024
# A decision longer than this (many containers, long names) is cut to its essentials.
MAX_BYTES = 2048
_ESSENTIALS = (
    "annotation",
    "claimTemplate",
    "classMemoryMiB",
    "fraction",
    "gpus",
    "memoryMiB",
    "migProfile",
    "mode",
    "orShareMiB",
    "requestedMiB",
    "resource",
    "rule",
    "schedulerName",
    "units",
)


def _escape(part: str) -> str:
    return part.replace("~", "~0").replace("/", "~1")  # RFC 6901


def _size(annotations: Mapping[str, Any], skip: str) -> int:
    return sum(len(k.encode()) + len(str(v).encode()) for k, v in annotations.items() if k != skip)


def patch_ops(
    metadata: Mapping[str, Any], key: str, decision: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], list[str]]:
    """(JSON patch operations writing `decision` under annotation `key`, warnings)."""
    text = orjson.dumps(decision, option=orjson.OPT_SORT_KEYS).decode()
    if len(text.encode()) > MAX_BYTES:
        short = {k: decision[k] for k in _ESSENTIALS if k in decision}
        text = orjson.dumps({**short, "truncated": True}, option=orjson.OPT_SORT_KEYS).decode()
    annotations = metadata.get("annotations") or {}
    if _size(annotations, key) + len(key.encode()) + len(text.encode()) > TOTAL_ANNOTATION_BYTES:
        return [], [f"gpuslice: annotation {key} left out: the pod's annotations are near the 256 KiB limit"]
    if annotations:
        return [{"op": "add", "path": f"/metadata/annotations/{_escape(key)}", "value": text}], []
    return [{"op": "add", "path": "/metadata/annotations", "value": {key: text}}], []
