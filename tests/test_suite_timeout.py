"""The suite's own guard: a test that hangs fails with its stack (pytest-timeout, pyproject's
`timeout`) instead of holding CI until its 90-minute limit."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap

import pytest

PYPROJECT = pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml"


def test_the_suite_has_a_timeout_for_every_test(pytestconfig: pytest.Config) -> None:
    assert float(pytestconfig.getini("timeout")) == 600


def test_a_test_that_hangs_fails_with_its_stack(tmp_path: pathlib.Path) -> None:
    hanging = tmp_path / "test_hangs.py"
    hanging.write_text(
        textwrap.dedent(
            """
            import asyncio

            async def test_waits_forever():
                await asyncio.Event().wait()  # an epoll_wait with nothing to wake it
            """
        )
    )
    # The project's own settings (asyncio mode), the limit cut to 2 s.
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(PYPROJECT)]
    run = subprocess.run(
        [*command, "--rootdir", str(tmp_path), "--timeout", "2", str(hanging)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Timeout" in run.stdout and "test_waits_forever" in run.stdout, run.stdout
