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
        "test_nvml_mock.py",
    }
    for path in (tests / "core").glob("test_*.py"):  # each names a module of the shared core
        stem = path.stem.removeprefix("test_")  # the module, or the module and an aspect: config_docs
        module = stem if (REPO / "gpuslice" / f"{stem}.py").exists() else stem.split("_")[0]
        assert (REPO / "gpuslice" / f"{module}.py").exists(), path


# Modules with no test file named after them, each with where it is tested instead. One table per
# code folder, so the folders' owners never edit the same lines.
UNTESTED_CORE: dict[str, str] = {}


UNTESTED_WEBHOOK: dict[str, str] = {
    "webhook/annotations": "through mutation.mutate: tests/webhook/test_mutation.py (DENIALS), test_dra_claims.py",
    "webhook/shape": "through admission.review: tests/webhook/test_admission.py (MALFORMED), test_decoding.py",
    "webhook/shares": "through mutation.mutate: tests/webhook/test_mutation.py (gpu-memory, gpu-fraction, MIG)",
    "webhook/tolerations": "through mutation.mutate: tests/webhook/test_mutation.py (tolerations, issue 14)",
    "webhook/wholegpus": "through mutation.mutate: tests/webhook/test_mutation.py (whole GPUs), test_foreign.py",
}


UNTESTED_DEVICEPLUGIN: dict[str, str] = {
    "deviceplugin/overuse": "through the usage monitor: tests/deviceplugin/test_monitor.py (episodes, each policy)",
    "deviceplugin/podapi": "the official client against a fake API server: tests/deviceplugin/test_monitor.py",
    "deviceplugin/usage_metrics": "the monitor's scrapes: tests/deviceplugin/test_monitor.py, test_main_monitor.py",
}


UNTESTED_NODE: dict[str, str] = {
    "node/metrics": "the plugin's /metrics: tests/deviceplugin/test_main.py; refusals: test_manager.py",
    "node/podresources": "kubelet's PodResources on a socket: tests/node/test_labeller.py, test_startup_unitsize.py",
    "node/runnables": "the plugins' start and stop: tests/deviceplugin/test_main.py, tests/dra/test_main.py",
}


UNTESTED_DRA: dict[str, str] = {
    "dra/cdi": "the specs the preparer writes and sweeps: tests/dra/test_preparer.py",
    "dra/kube": "against the real API server: tests/e2e/test_real_dra.py (dra_kit.FakeApi stands in elsewhere)",
    "dra/shares": "a claim's allocation to what its containers get: tests/dra/test_preparer.py",
}


UNTESTED_MPS: dict[str, str] = {}


UNTESTED_CONTROLLER: dict[str, str] = {}


UNTESTED_PACER: dict[str, str] = {}


UNTESTED_SIM: dict[str, str] = {
    "sim/controlplane": "tests/e2e/test_real_control_plane.py starts it (loopback only, the pinned version);"
    " every other tests/e2e test runs on it",
    "sim/kube_api": "the replay's API client: every tests/e2e/test_real_replay.py replay goes through it",
    "sim/kube_nodes": "its admission and grants in tests/sim/test_kube_outcomes.py (the placements test drives"
    " Fleet); its Node objects, watch and labellers in every tests/e2e/test_real_replay.py replay",
    "sim/node": "through the model replay: tests/sim/test_replay.py (kubelet's admission failures, the units"
    " granted and credited per GPU)",
}


UNTESTED_DEMO: dict[str, str] = {
    "demo/tls": "the demo's webhook serves HTTPS with its certificates in tests/demo/test_main.py (run_demo and"
    " the command)",
}


UNTESTED_PROTO: dict[str, str] = {}


UNTESTED = {
    "gpuslice": UNTESTED_CORE,
    "webhook": UNTESTED_WEBHOOK,
    "deviceplugin": UNTESTED_DEVICEPLUGIN,
    "node": UNTESTED_NODE,
    "dra": UNTESTED_DRA,
    "mps": UNTESTED_MPS,
    "controller": UNTESTED_CONTROLLER,
    "pacer": UNTESTED_PACER,
    "sim": UNTESTED_SIM,
    "demo": UNTESTED_DEMO,
    "proto": UNTESTED_PROTO,
}


def _code_folders() -> list[tuple[pathlib.Path, pathlib.Path, dict[str, str]]]:
    """(code folder, its tests folder, its table) for each folder and sub-package of code."""
    pairs = []
    for top, table in UNTESTED.items():
        code = REPO / top
        for package in [code, *sorted(p for p in code.iterdir() if (p / "__init__.py").is_file())]:
            if top == "gpuslice" and package != code:
                continue  # gpuslice/<folder> are the links to the folders themselves
            if top == "proto" and package != code:
                continue  # generated stubs and their pinned .proto files
            tests = REPO / "tests" / ("core" if top == "gpuslice" else top) / package.relative_to(code)
            pairs.append((package, tests, table))
    return pairs


def _id(value: object) -> str:
    return str(pathlib.Path(str(value)).relative_to(REPO)) if isinstance(value, pathlib.Path) else "table"


def _modules(package: pathlib.Path) -> set[str]:
    return {p.stem for p in package.glob("*.py") if p.stem != "__init__"}


@pytest.mark.parametrize("code,tests,table", _code_folders(), ids=_id)
def test_each_test_file_is_named_after_a_module_of_its_folder(
    code: pathlib.Path, tests: pathlib.Path, table: dict[str, str]
) -> None:
    """tests/<folder>/test_<module>.py, or test_<module>_<aspect>.py for one aspect of a module."""
    modules = _modules(code)
    for path in tests.glob("test_*.py"):
        stem = path.stem.removeprefix("test_")
        parts = stem.split("_")
        assert any("_".join(parts[:n]) in modules for n in range(len(parts), 0, -1)), (
            f"{path.relative_to(REPO)} names no module of {code.relative_to(REPO)}/"
        )


@pytest.mark.parametrize("code,tests,table", _code_folders(), ids=_id)
def test_each_module_has_a_test_file_or_says_where_it_is_tested(
    code: pathlib.Path, tests: pathlib.Path, table: dict[str, str]
) -> None:
    """Keys of the tables are modules as paths from the repository's root: "webhook/steering/exprs"."""
    named = {m for m in _modules(code) if (tests / f"test_{m}.py").exists() or any(tests.glob(f"test_{m}_*.py"))}
    folder = code.relative_to(REPO)
    untested = {f"{folder}/{m}" for m in _modules(code) - named}
    exempt = {key for key in table if pathlib.PurePath(key).parent == folder}
    assert untested <= exempt, (
        f"no test file named after, and no word on where it is tested: {sorted(untested - exempt)}"
    )
    assert exempt <= untested, (
        f"said to be tested elsewhere, yet with a test file or no module: {sorted(exempt - untested)}"
    )
    assert all(reason.strip() for reason in table.values())
