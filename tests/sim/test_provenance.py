"""Every replay output names the commit it ran from (sim/provenance.py)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

from gpuslice.sim import provenance

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(directory: pathlib.Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(directory), *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


@needs_git
def test_a_checkout_is_named_by_its_commit_and_marked_dirty_when_tracked_files_changed(tmp_path: pathlib.Path) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "one")
    head = _git(tmp_path, "rev-parse", "--short=7", "HEAD")
    assert provenance.source_commit(tmp_path) == head
    (tmp_path / "untracked.json").write_text("{}")  # a run's own output beside the code: still clean
    assert provenance.source_commit(tmp_path) == head
    (tmp_path / "a.py").write_text("x = 2\n")
    assert provenance.source_commit(tmp_path) == f"{head}-dirty"


@needs_git
def test_outside_a_repository_the_commit_is_unknown(tmp_path: pathlib.Path) -> None:
    assert provenance.source_commit(tmp_path / "not-a-checkout") is None
    assert provenance.source_commit(tmp_path) is None


def test_without_git_the_commit_is_unknown(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no git on it
    assert provenance.source_commit(tmp_path) is None
