"""Progress bars for long simulator runs, drawn on stderr only when stderr is a terminal: CI logs,
pipes and redirected output (--json included, which goes to stdout anyway) see nothing.

May import tqdm only.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

import tqdm

__all__ = ["bar"]


def bar(total: int, description: str, *, unit: str = "pod", stream: TextIO | None = None) -> tqdm.tqdm[Any]:
    """A bar of `total` `unit`s on `stream` (default: stderr at the time of the call), disabled
    (every update a no-op) when that stream is not a TTY. Use it as a context manager."""
    out = sys.stderr if stream is None else stream
    return tqdm.tqdm(
        total=total,
        desc=description,
        unit=unit,
        file=out,
        disable=not out.isatty(),
        leave=False,  # the report follows; a finished bar is only clutter above it
        dynamic_ncols=True,
    )
