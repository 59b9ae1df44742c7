"""The table of keys in docs/configuration.md is the one the schema's declarations describe."""

from __future__ import annotations

import difflib
import pathlib

from gpuslice import config

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def table_in(text: str) -> str:
    """The Markdown table that starts with the schema's header row."""
    lines = text.splitlines()
    start = lines.index(config.describe().splitlines()[0])
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join(lines[start:end])


def test_the_documented_table_is_the_schema_s_own():
    documented, described = table_in(DOC.read_text(encoding="utf-8")), config.describe()
    diff = "\n".join(
        difflib.unified_diff(documented.splitlines(), described.splitlines(), "docs", "schema", lineterm="")
    )
    assert documented == described, (
        "docs/configuration.md's table differs from the declarations in gpuslice/config.py; "
        f"replace it with the output of `python -m gpuslice.config`:\n{diff}"
    )
