"""The simulator's progress bars (sim/progress.py): drawn on a terminal only, so logs, pipes and
redirected output see nothing. How the replays feed them: tests/sim/test_main.py."""

from __future__ import annotations

import io
import sys

import pytest

from gpuslice.sim import progress


class _Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_a_terminal_is_drawn_on_with_the_description_and_the_count() -> None:
    terminal = _Terminal()
    with progress.bar(4, "replaying whole-gpu", stream=terminal) as shown:
        assert not shown.disable
        shown.update(3)
        shown.refresh()
        assert "replaying whole-gpu" in terminal.getvalue() and "3/4" in terminal.getvalue()
    assert shown.n == 3
    # Closed, it wipes its line: the report printed next starts on a clean one.
    assert terminal.getvalue().rstrip("\r").rsplit("\r", 1)[-1].strip() == ""


def test_a_stream_that_is_not_a_terminal_sees_nothing() -> None:
    piped = io.StringIO()
    with progress.bar(4, "replaying", stream=piped) as shown:
        assert shown.disable
        shown.update(4)
    assert piped.getvalue() == ""


def test_without_a_stream_the_bar_goes_to_stderr_as_it_is_when_made(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)  # as a test runner or a caller swaps it in
    with progress.bar(2, "seeds", unit="seed") as shown:
        shown.update(1)
        shown.refresh()
    assert "seeds:" in terminal.getvalue() and "1/2" in terminal.getvalue() and "seed/s" in terminal.getvalue()
