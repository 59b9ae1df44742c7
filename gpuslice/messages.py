"""How a refusal names the bad input it was given: a short quote of the value, never the whole of
it (an annotation or a label may be kilobytes long, and the message reaches a user's terminal, an
Event and a log line). Every parser of user or node input (gpuslice.quantity, gpuslice.labelcodec,
the webhook's parsing) quotes through here.

Imports nothing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["QUOTE_CHARS", "cut", "quote"]

QUOTE_CHARS = 100


def quote(value: Any) -> str:
    """`value` as a Python literal, cut to QUOTE_CHARS characters (the length said when cut)."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= QUOTE_CHARS:
        return repr(text)
    return f"{text[:QUOTE_CHARS]!r}... ({len(text)} characters)"


def cut(text: str) -> str:
    """`text` (a list the message names, say) cut to QUOTE_CHARS characters."""
    return text if len(text) <= QUOTE_CHARS else f"{text[:QUOTE_CHARS]}... ({len(text)} characters)"
