"""The layout: the top-level folders are the architecture, and each is importable as gpuslice.<folder>
through a symlink, so Python, mypy, editors and the wheel all resolve the same files."""

from __future__ import annotations

import importlib
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
FOLDERS = ("webhook", "deviceplugin", "node", "mps", "dra", "pacer", "controller", "sim", "demo", "proto")


@pytest.mark.parametrize("folder", FOLDERS)
def test_each_top_level_folder_is_the_package_of_the_same_name(folder: str) -> None:
    link = REPO / "gpuslice" / folder
    assert link.is_symlink() and link.readlink() == pathlib.Path("..", folder)
    module = importlib.import_module(f"gpuslice.{folder}")
    assert pathlib.Path(module.__file__ or "").resolve().parent == REPO / folder


def test_every_console_script_names_an_importable_function() -> None:
    import tomllib

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    for name, target in scripts.items():
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), name


def test_the_tests_mirror_the_code() -> None:
    """tests/<folder>/ for each code folder (core: the shared layers under gpuslice/; charts, tools,
    e2e apart), and every test module in one: none left flat but the tests of the kits and the
    repository as a whole."""
    tests = REPO / "tests"
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name not in ("data", "__pycache__")}
    assert folders <= {*FOLDERS, "core", "charts", "tools", "e2e"}, folders
    flat = {p.name for p in tests.glob("test_*.py")}
    assert flat <= {
        "test_layout.py",
        "test_suite_timeout.py",
        "test_examples.py",
        "test_kubelet_emulator.py",
        "test_nvml_mock.py",
    }
    for path in (tests / "core").glob("test_*.py"):  # each names a module of the shared core
        stem = path.stem.removeprefix("test_")  # the module, or the module and an aspect: config_docs
        module = stem if (REPO / "gpuslice" / f"{stem}.py").exists() else stem.split("_")[0]
        assert (REPO / "gpuslice" / f"{module}.py").exists(), path
