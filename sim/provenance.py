"""Which version of the code produced a figure: replays take minutes each and are put together
across days (sim/summary.py), so every JSON output names the commit it ran from.

May import the standard library only.
"""

from __future__ import annotations

import os
import pathlib
import subprocess

__all__ = ["SOURCE", "source_commit"]

SOURCE = pathlib.Path(__file__).resolve().parent.parent  # the checkout gpuslice runs from (it finds ../shared too)


def source_commit(directory: str | os.PathLike[str] = SOURCE) -> str | None:
    """The checkout's commit, abbreviated, with "-dirty" when tracked files differ from it; None
    where there is no git or no repository (an installed package): an output says it does not know
    rather than guess."""
    try:
        done = subprocess.run(
            ["git", "-C", str(directory), "describe", "--always", "--dirty", "--abbrev=7"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else None
