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
