#!/usr/bin/env python3
"""Build the container image's runtime virtualenv, or check the image recipe without a container engine.

`build` is what the Dockerfile's build stage runs (as root, with the base image's Python, after it
installed requirements/build.txt with hashes):

    python tools/build-image-venv.py build --src /src --dest /opt/gpuslice

  1. generate the gRPC stubs (grpcio-tools, a build-time tool only);
  2. build the gpuslice wheel from the source (setuptools, no build isolation: nothing unlocked) and
     take the tools out of it (TOOLS: the packing simulator and the demo, their console scripts);
  3. make a venv without pip at --dest and install requirements/image.txt into it with
     --require-hashes and wheels only, then the gpuslice wheel without dependencies;
  4. prune what no gpuslice code imports (PRUNED: kubernetes' asyncio twin, numpy's tests);
  5. check that the tools and what only they import (ABSENT) are not in the venv, and that its only
     gpuslice commands are the chart's; start each of them with --help.

`check` (`make image-check`) runs the same steps where there is no engine: a throwaway venv stands in
for the base image's Python (requirements/build.txt installed with hashes, as the Dockerfile does),
the build context is copied as .dockerignore leaves it, the venv is built into a throwaway
/opt/gpuslice, the entry points are started as the image's user (uid from the Dockerfile's USER,
when run as root), and the sizes are printed. It needs the package registry (pip), nothing else.

Standard library only. May import nothing from gpuslice (it runs before gpuslice is installed).
"""

from __future__ import annotations

import argparse
import base64
import fnmatch
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence

REPO = pathlib.Path(__file__).resolve().parent.parent
# The chart's commands.
ENTRY_POINTS = (
    "gpuslice-webhook",
    "gpuslice-device-plugin",
    "gpuslice-mps-control-daemon",
    "gpuslice-dra-plugin",
    "gpuslice-controller",
)
RUNTIME_LOCK = "requirements/image.txt"
BUILD_LOCK = "requirements/build.txt"
# Paths under site-packages (globs) that no gpuslice code imports, removed from the image:
# kubernetes.aio is a complete asyncio copy of the generated client (about 68 MB); numpy's test suites.
PRUNED = ("kubernetes/aio", "numpy/**/tests")

# The tools: in the repository and the development install, not in the image. They run the product's
# code on simulated nodes, and nothing the chart runs imports them (the import-linter layers in
# pyproject.toml). The wheel the image installs is rewritten without their packages and console
# scripts (its RECORD rewritten to match), so that no file or command of theirs reaches the venv.
TOOLS = ("gpuslice.sim", "gpuslice.demo")
# Importable in the development venv, never in the image's: the tools, and what only they import (the
# `sim` extra of pyproject.toml, which requirements/image.txt does not lock). Paths under site-packages.
ABSENT = ("gpuslice/sim", "gpuslice/demo", "tqdm", "jsonpatch", "cryptography")

Runner = Callable[..., None]


class BuildError(RuntimeError):
    """A build step failed; the message says which and why."""


def run(command: Sequence[str | os.PathLike[str]], *, cwd: pathlib.Path | None = None, user: int | None = None) -> None:
    """Run one step, echoing it; a failure raises BuildError with the command's output."""
    words = [str(word) for word in command]
    print("+", " ".join(words), flush=True)
    kwargs = {}
    if user is not None:
        kwargs = {"user": user, "group": user, "extra_groups": []}
    try:
        result = subprocess.run(words, cwd=cwd, check=False, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    except OSError as exc:
        raise BuildError(f"{' '.join(words)} could not start: {exc}") from None
    if result.returncode != 0:
        raise BuildError(f"{' '.join(words)} exited {result.returncode}:\n{result.stdout}{result.stderr}")


def site_packages(venv: pathlib.Path) -> pathlib.Path:
    (path,) = venv.glob("lib/python3*/site-packages")
    return path


def prune(venv: pathlib.Path) -> list[pathlib.Path]:
    """Remove PRUNED from the venv; each pattern must match (a lock update that moves them is noticed)."""
    root = site_packages(venv)
    removed: list[pathlib.Path] = []
    for pattern in PRUNED:
        matches = [path for path in root.glob(pattern) if path.is_dir()]
        if not matches:
            raise BuildError(f"nothing in {root} matches {pattern!r}: update PRUNED in {__file__}")
        for path in matches:
            if path.exists():  # not inside one removed already
                shutil.rmtree(path)
                removed.append(path)
    return removed


def is_tool(module: str) -> bool:
    return any(module == tool or module.startswith(tool + ".") for tool in TOOLS)


def record_line(name: str, data: bytes) -> str:
    """A RECORD row as the wheel format writes it: urlsafe base64 sha256 without padding, size."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def product_wheel(wheels: pathlib.Path) -> tuple[list[str], list[str]]:
    """Rewrite the gpuslice wheel in `wheels` without TOOLS: their files, and their entry points in
    entry_points.txt (so pip makes no command for them), RECORD rewritten to match: what is installed
    is what the metadata says. Returns (files, entry points) left out. The console scripts left must
    be the chart's ENTRY_POINTS exactly: a new command is either one the image runs (add it to
    ENTRY_POINTS) or a tool's (its package in TOOLS)."""
    (wheel,) = wheels.glob("gpuslice-*.whl")
    tool_paths = tuple(tool.replace(".", "/") + "/" for tool in TOOLS)
    files: list[str] = []
    entry_points: list[str] = []
    kept: list[tuple[zipfile.ZipInfo, bytes]] = []
    scripts: list[str] = []
    with zipfile.ZipFile(wheel) as source:
        for info in source.infolist():
            if info.filename.startswith(tool_paths):
                files.append(info.filename)
                continue
            data = source.read(info)
            if info.filename.endswith(".dist-info/entry_points.txt"):
                lines, group = [], ""
                for line in data.decode().splitlines(keepends=True):
                    header = re.fullmatch(r"\[(.+)\]\s*", line)
                    group = header.group(1) if header else group
                    entry = re.fullmatch(r"\s*([^=\s]+)\s*=\s*([\w.]+)\s*:.*\s*", line)
                    if entry and is_tool(entry.group(2)):
                        entry_points.append(f"{entry.group(1)} ({group})")
                        continue
                    if entry and group == "console_scripts":
                        scripts.append(entry.group(1))
                    lines.append(line)
                data = "".join(lines).encode()
            kept.append((info, data))
    missing = [tool for tool, path in zip(TOOLS, tool_paths, strict=True) if not any(f.startswith(path) for f in files)]
    if missing:
        raise BuildError(f"{wheel.name} has no {', '.join(missing)}: update TOOLS in {__file__}")
    if sorted(scripts) != sorted(ENTRY_POINTS):
        raise BuildError(
            f"{wheel.name}'s console scripts less the tools' are {sorted(scripts)}, the image's are "
            f"{sorted(ENTRY_POINTS)}: add a command the chart runs to ENTRY_POINTS, a tool's package to TOOLS"
        )
    (record,) = [info.filename for info, _ in kept if info.filename.endswith(".dist-info/RECORD")]
    kept = [(info, data) for info, data in kept if info.filename != record]
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as target:
        for info, data in kept:
            target.writestr(info, data)
        rows = [record_line(info.filename, data) for info, data in kept]
        target.writestr(record, "\n".join([*rows, f"{record},,", ""]))  # last, as wheels have it
    return files, entry_points


def leftovers(venv: pathlib.Path) -> list[str]:
    """What of ABSENT is in the venv, and any gpuslice command besides ENTRY_POINTS."""
    root = site_packages(venv)
    found = [name for name in ABSENT if (root / name).exists() or (root / f"{name}.py").exists()]
    commands = {path.name for path in (venv / "bin").glob("gpuslice*")}
    return found + sorted(f"bin/{name}" for name in commands - set(ENTRY_POINTS))


def check_absent(venv: pathlib.Path) -> None:
    found = leftovers(venv)
    if found:
        raise BuildError(f"the image's venv has what only the tools need: {', '.join(found)}")


def build(
    src: pathlib.Path,
    dest: pathlib.Path,
    python: str = sys.executable,
    runner: Runner = run,
    pruner: Callable[[pathlib.Path], list[pathlib.Path]] = prune,
    slimmer: Callable[[pathlib.Path], tuple[list[str], list[str]]] = product_wheel,
    checker: Callable[[pathlib.Path], None] = check_absent,
) -> None:
    """The image's /opt/gpuslice: a venv of locked wheels and gpuslice less its tools, pruned, checked."""
    runner([python, "proto/generate.py"], cwd=src)
    with tempfile.TemporaryDirectory(prefix="gpuslice-wheel-") as wheels:
        wheel = ["-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir", wheels]
        runner([python, *wheel, str(src)])
        files, entry_points = slimmer(pathlib.Path(wheels))
        print(f"left out of the wheel: {', '.join(TOOLS)} ({len(files)} files); {', '.join(entry_points)}")
        # No pip in the runtime venv: the build Python's pip installs into it (pip --python).
        runner([python, "-m", "venv", "--without-pip", str(dest)])
        target = ["-m", "pip", "--python", str(dest / "bin" / "python"), "install", "--quiet", "--no-deps"]
        runner([python, *target, "--require-hashes", "--only-binary=:all:", "-r", str(src / RUNTIME_LOCK)])
        runner([python, *target, "--no-index", "--find-links", wheels, "gpuslice"])
    for path in pruner(dest):
        print(f"pruned {path.relative_to(dest)}")
    checker(dest)
    print(f"absent from the venv: {', '.join(ABSENT)}; its gpuslice commands: {', '.join(ENTRY_POINTS)}")
    for command in ENTRY_POINTS:
        runner([str(dest / "bin" / command), "--help"])


# --- check: the recipe without a container engine ------------------------------------------------


def dockerfile_user(dockerfile: pathlib.Path) -> tuple[int, int]:
    """(uid, gid) of the final stage's USER, which must be numeric and not root."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    stages = re.split(r"(?im)^FROM\s", text)
    users = re.findall(r"(?im)^USER\s+(\S+)", stages[-1])
    if len(users) != 1:
        raise BuildError(f"the final stage of {dockerfile} has {len(users)} USER lines, expected 1")
    match = re.fullmatch(r"(\d+):(\d+)", users[0])
    if not match or int(match.group(1)) == 0:
        raise BuildError(f"USER {users[0]}: the image must run as a numeric non-root uid:gid (runAsNonRoot checks it)")
    return int(match.group(1)), int(match.group(2))


def dockerignore_patterns(context: pathlib.Path) -> list[str]:
    lines = (context / ".dockerignore").read_text().splitlines()
    return [line.strip().lstrip("/") for line in lines if line.strip() and not line.strip().startswith("#")]


def ignored(relative: str, patterns: Sequence[str]) -> bool:
    """Whether .dockerignore leaves `relative` out of the context (its patterns as this repo uses them)."""
    parts = relative.split("/")
    for pattern in patterns:
        if pattern.startswith("**/"):
            if any(fnmatch.fnmatch(part, pattern[3:]) for part in parts):
                return True
        elif any(fnmatch.fnmatch("/".join(parts[: i + 1]), pattern) for i in range(len(parts))):
            return True
    return False


def copy_context(context: pathlib.Path, into: pathlib.Path) -> None:
    """The files `COPY . .` would see: the context less what .dockerignore leaves out."""
    patterns = dockerignore_patterns(context)
    for path in sorted(context.rglob("*")):
        relative = path.relative_to(context).as_posix()
        inside_link = any((context / parent).is_symlink() for parent in path.relative_to(context).parents)
        if ignored(relative, patterns) or inside_link:
            continue
        if path.is_symlink():
            # COPY keeps symlinks as they are: gpuslice/<folder> -> ../<folder> is how the wheel finds
            # the top-level folders (pyproject.toml).
            (into / relative).parent.mkdir(parents=True, exist_ok=True)
            (into / relative).symlink_to(path.readlink())
        elif path.is_file():
            (into / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, into / relative)


def closed_to_others(path: pathlib.Path) -> list[pathlib.Path]:
    """Files under `path` that another user cannot read (or directories it cannot enter): the image's
    non-root user would fail on them."""
    closed = []
    for item in [path, *path.rglob("*")]:
        if item.is_symlink():
            continue
        mode = item.stat().st_mode
        needed = 0o005 if item.is_dir() or mode & 0o100 else 0o004
        if mode & needed != needed:
            closed.append(item)
    return closed


def reachable_by_others(path: pathlib.Path) -> bool:
    """Whether another user can reach `path` (every directory above it enterable by others)."""
    return all(parent.stat().st_mode & 0o001 for parent in path.resolve().parents)


def sizes(venv: pathlib.Path, top: int = 12) -> list[tuple[str, int]]:
    """(name, bytes) of the venv and its largest site-packages entries."""

    def size(path: pathlib.Path) -> int:
        if path.is_file():
            return path.stat().st_size
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())

    entries = [(p.name, size(p)) for p in site_packages(venv).iterdir()]
    return [("venv total", size(venv)), *sorted(entries, key=lambda e: -e[1])[:top]]


def check(context: pathlib.Path = REPO, keep: pathlib.Path | None = None) -> None:
    uid, gid = dockerfile_user(context / "Dockerfile")
    with tempfile.TemporaryDirectory(prefix="gpuslice-image-check-") as tmp:
        root = keep or pathlib.Path(tmp)
        src, build_python, dest = root / "src", root / "build-python", root / "opt" / "gpuslice"
        # The base image's Python with the Dockerfile's locked build tools.
        run([sys.executable, "-m", "venv", str(build_python)])
        python = str(build_python / "bin" / "python")
        locked = ["--require-hashes", "--no-deps", "--only-binary=:all:", "-r", str(context / BUILD_LOCK)]
        run([python, "-m", "pip", "install", "--quiet", *locked])
        copy_context(context, src)
        build(src, dest, python)
        # Readable and runnable by the image's user, not only by root who built it.
        closed = closed_to_others(dest)
        if closed:
            raise BuildError(f"{len(closed)} paths of the venv are closed to the image's uid {uid}, e.g. {closed[:3]}")
        interpreter = (dest / "bin" / "python").resolve()
        if os.geteuid() == 0 and reachable_by_others(interpreter):
            root.chmod(0o755)  # a temporary directory is 0700; /opt in the image is 0755
            for command in ENTRY_POINTS:
                run([str(dest / "bin" / command), "--help"], user=uid)
            print(f"venv open to other users; entry points start as uid {uid} (gid {gid})")
        else:
            print(
                f"venv open to other users; entry points started as uid {os.geteuid()} only "
                f"(this machine's {interpreter} is not reachable by uid {uid}; the image's /usr/local is)"
            )
        for name, size in sizes(dest):
            print(f"{size / 2**20:8.1f} MiB  {name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build_parser = commands.add_parser("build", help="build the venv (the Dockerfile's build stage)")
    build_parser.add_argument("--src", type=pathlib.Path, required=True)
    build_parser.add_argument("--dest", type=pathlib.Path, required=True)
    check_parser = commands.add_parser("check", help="check the image recipe without a container engine")
    check_parser.add_argument("--keep", type=pathlib.Path, help="build there and keep it (default: a temporary one)")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            build(args.src.resolve(), args.dest)
            for name, size in sizes(args.dest):
                print(f"{size / 2**20:8.1f} MiB  {name}")
        else:
            check(keep=args.keep)
    except BuildError as exc:
        print(f"build-image-venv: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
