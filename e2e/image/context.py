#!/usr/bin/env python3
"""The image's build context from a git checkout: its key, and a copy of it to build from.

    python3 e2e/image/context.py REPO [--stage DEST]

The context is what git sees in the working tree (tracked files as they are now, and untracked
files that .gitignore does not hide), less what .dockerignore leaves out, matched as Docker matches
it (patterns anchored at the root, `*` within one path segment, `**` across segments, `!` to take a
path back in, a pattern that matches a directory takes everything under it). Stray local files
(build outputs, .k8s-bin) stay out, so the same commit always builds the same context.

Prints the context's key: the sha256 of every file's path, mode and content (a symlink's target),
in path order. With --stage, also copies the files into DEST (an empty or missing directory),
symlinks as symlinks and modes kept, as `COPY . .` would see them.

Standard library only; imports nothing from gpuslice.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterable, Sequence


class Pattern:
    """One .dockerignore line, compiled as moby/patternmatcher compiles it."""

    def __init__(self, line: str) -> None:
        self.exclusion = line.startswith("!")
        text = os.path.normpath(line[1:].strip() if self.exclusion else line).lstrip("/")
        self.text = text
        self.regex = re.compile("^" + _translate(text) + "$")

    def matches(self, path: str) -> bool:
        return self.regex.match(path) is not None


def _translate(pattern: str) -> str:
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):
                i += 1
            out.append(".*" if i >= len(pattern) else "(.*/)?")
            continue
        if ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out.append(re.escape(ch))
            else:
                out.append(pattern[i : end + 1])
                i = end
        elif ch == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out)


def read_patterns(repo: pathlib.Path) -> list[Pattern]:
    path = repo / ".dockerignore"
    if not path.exists():
        return []
    lines = (line.strip() for line in path.read_text().splitlines())
    return [Pattern(line) for line in lines if line and not line.startswith("#")]


def excluded(path: str, patterns: Sequence[Pattern]) -> bool:
    """Whether .dockerignore leaves `path` out: the last pattern that matches it or a parent decides."""
    parents = path.split("/")[:-1]
    matched = False
    for pattern in patterns:
        if pattern.exclusion != matched:
            continue
        hit = pattern.matches(path) or any(pattern.matches("/".join(parents[: i + 1])) for i in range(len(parents)))
        if hit:
            matched = not pattern.exclusion
    return matched


def git_files(repo: pathlib.Path) -> list[str]:
    listing = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout
    names = {name.decode() for name in listing.split(b"\0") if name}
    # A tracked file deleted in the working tree is not in the context.
    return sorted(name for name in names if os.path.lexists(repo / name))


def context_files(repo: pathlib.Path) -> list[str]:
    patterns = read_patterns(repo)
    return [name for name in git_files(repo) if not excluded(name, patterns)]


def key(repo: pathlib.Path, names: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for name in names:
        path = repo / name
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            kind, body = "l", os.readlink(path).encode()
        else:
            kind, body = "f", path.read_bytes()
        digest.update(f"{name}\0{kind}{stat.S_IMODE(info.st_mode):o}\0".encode())
        digest.update(hashlib.sha256(body).digest())
    return digest.hexdigest()


def stage(repo: pathlib.Path, names: Iterable[str], dest: pathlib.Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise SystemExit(f"context.py: {dest} is not empty")
    for name in names:
        source, target = repo / name, dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repo", type=pathlib.Path)
    parser.add_argument("--stage", type=pathlib.Path, metavar="DEST", help="also copy the context here")
    args = parser.parse_args(argv)
    repo = args.repo.resolve()
    names = context_files(repo)
    if not names:
        raise SystemExit(f"context.py: no files in the build context of {repo}")
    if args.stage is not None:
        stage(repo, names, args.stage)
    print(key(repo, names))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
