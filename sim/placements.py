"""`gpuslice-sim --placements FILE`: one JSON line per pod of every replay, and the recomputation of
the reported figures from that file alone (`python -m gpuslice.sim.placements FILE`).

The file holds, per (configuration, seed), a `run` line (GPUs in the cluster and the figures the
simulator reported) followed by one `pod` line per arrival: its outcome (placed, unschedulable,
refused by kubelet, denied by the webhook) with the message, its node, and per GPU it holds the
units granted, the GPU's total units, the unit size and the GPU's memory. Anyone can recompute the
granted allocation ratio (per GPU: units x unit size / memory, at most 1; summed over GPUs, over the
cluster's GPUs) and the requested one (placed pods' gpu_milli) without the simulator.

May import gpuslice.sim.replay (its Result) only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Any

from gpuslice.sim import replay

__all__ = ["Figures", "PlacementsError", "lines", "main", "recompute", "records", "write"]


class PlacementsError(Exception):
    """The placements file is not what `gpuslice-sim --placements` writes."""


def lines(configuration: str, seed: int, pods_file: str, result: replay.Result) -> Iterator[dict[str, Any]]:
    """The `run` line and the `pod` lines of one replay (run with placements=True)."""
    if result.placements is None:
        raise ValueError(f"{configuration}, seed {seed}: the replay did not record placements")
    yield {
        "record": "run",
        "configuration": configuration,
        "seed": seed,
        "pods_file": pods_file,
        "pods": result.pods,
        "total_gpus": result.total_gpus,
        "gpu_allocation_ratio": result.gpu_allocation_ratio,
        "requested_allocation_ratio": result.requested_allocation_ratio,
    }
    for record in result.placements:
        yield {"record": "pod", "configuration": configuration, "seed": seed, **record}


def write(handle: IO[str], runs: Iterable[tuple[str, int, str, replay.Result]]) -> None:
    """Every replay's lines to `handle`; runs are (configuration, seed, pod file name, result)."""
    for configuration, seed, pods_file, result in runs:
        for line in lines(configuration, seed, pods_file, result):
            handle.write(json.dumps(line, separators=(",", ":")) + "\n")


@dataclasses.dataclass(frozen=True)
class Figures:
    """One replay's figures as recomputed from its lines, beside what the simulator reported."""

    configuration: str
    seed: int
    total_gpus: int
    pods: int
    placed: int
    gpu_allocation_ratio: float
    requested_allocation_ratio: float
    reported_gpu_allocation_ratio: float
    reported_requested_allocation_ratio: float

    @property
    def matches(self) -> bool:
        granted = math.isclose(self.gpu_allocation_ratio, self.reported_gpu_allocation_ratio, abs_tol=1e-9)
        asked = math.isclose(self.requested_allocation_ratio, self.reported_requested_allocation_ratio, abs_tol=1e-9)
        return granted and asked


def records(text_lines: Iterable[str]) -> Iterator[tuple[int, tuple[str, int], dict[str, Any]]]:
    """(line number, (configuration, seed), line) of every line of a placements file, blank lines
    skipped; PlacementsError for a line that is not JSON with those fields, or a pod line before
    its run's `run` line."""
    started: set[tuple[str, int]] = set()
    for number, text in enumerate(text_lines, start=1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
            key = (line["configuration"], line["seed"])
            kind = line["record"]
        except (ValueError, KeyError, TypeError) as exc:
            raise PlacementsError(f"line {number}: not a placements line ({exc!r})") from None
        if kind == "run":
            started.add(key)
        elif key not in started:
            raise PlacementsError(f"line {number}: pod line before the run line of {key[0]}, seed {key[1]}")
        yield number, key, line


def recompute(text_lines: Iterable[str]) -> list[Figures]:
    """The figures of every replay in a placements file, from its pod lines alone."""
    runs: dict[tuple[str, int], dict[str, Any]] = {}
    shares: dict[tuple[str, int], dict[tuple[str, str], float]] = {}
    requested: dict[tuple[str, int], int] = {}
    counts: dict[tuple[str, int], list[int]] = {}
    for _, key, line in records(text_lines):
        if line["record"] == "run":
            runs[key] = line
            shares.setdefault(key, {})
            requested.setdefault(key, 0)
            counts.setdefault(key, [0, 0])
            continue
        counts[key][0] += 1
        if line["outcome"] != "placed":
            continue
        counts[key][1] += 1
        requested[key] += line["requested_milli"]
        per_gpu = shares[key]
        for gpu in line["gpus"]:
            where = (line["node"], gpu["uuid"])
            per_gpu[where] = per_gpu.get(where, 0.0) + gpu["units"] * gpu["unit_mib"] / gpu["gpu_memory_mib"]
    out = []
    for key, run in runs.items():
        total = run["total_gpus"]
        granted = sum(min(1.0, share) for share in shares[key].values())
        out.append(
            Figures(
                configuration=key[0],
                seed=key[1],
                total_gpus=total,
                pods=counts[key][0],
                placed=counts[key][1],
                gpu_allocation_ratio=granted / total if total else 0.0,
                requested_allocation_ratio=requested[key] / (total * 1000) if total else 0.0,
                reported_gpu_allocation_ratio=run["gpu_allocation_ratio"],
                reported_requested_allocation_ratio=run["requested_allocation_ratio"],
            )
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpuslice.sim.placements",
        description="Recompute gpuslice-sim's allocation ratios from a --placements file.",
    )
    parser.add_argument("file", help="the file written by gpuslice-sim --placements")
    args = parser.parse_args(argv)
    try:
        with pathlib.Path(args.file).open(encoding="utf-8") as handle:
            figures = recompute(handle)
    except (OSError, PlacementsError) as exc:
        print(f"placements: {args.file}: {exc}", file=sys.stderr)
        return 2
    print(f"{'configuration':<20}{'seed':>6}{'placed':>8}{'granted':>10}{'requested':>11}  reported")
    for f in figures:
        verdict = (
            "same"
            if f.matches
            else (f"DIFFERS ({f.reported_gpu_allocation_ratio:.4%}, {f.reported_requested_allocation_ratio:.4%})")
        )
        print(
            f"{f.configuration:<20}{f.seed:>6}{f.placed:>8}{f.gpu_allocation_ratio:>10.4%}"
            f"{f.requested_allocation_ratio:>11.4%}  {verdict}"
        )
    return 0 if all(f.matches for f in figures) else 1


if __name__ == "__main__":
    sys.exit(main())
