"""Where the GPU memory a replay left unallocated sits, from a `--placements` file alone
(`python -m gpuslice.sim.stranded FILE`).

The allocation ratio says how much was granted; this says what the rest is made of, per replay:
GPUs nothing was placed on, and the free share of partly used GPUs grouped by what each GPU holds
(its size in units and the shares of the pods on it). Each hole is also weighed by how many of the
replay's sharing pods (one GPU, less than all of it) would have fitted in it: a hole that almost
no pod of the workload fits is lost to the workload's shapes, not to where the scheduler put
things. docs/benchmarks.md ("What the default trace leaves unallocated") reads it.

A pod of `gpu_milli` is taken to need, on a GPU of `total_units`, the fewest units a placed pod of
that share was granted on a GPU of that size in the same replay; a share never placed on such a
GPU needs floor(gpu_milli x total_units / 1000), the webhook's rounding of a fraction.

May import gpuslice.sim.placements (its reader and error) only.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import pathlib
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from gpuslice.sim import placements
from gpuslice.sim.placements import PlacementsError

__all__ = ["Stranded", "main", "stranded"]

_RARE = 0.05  # a hole at most this share of the replay's sharing pods fits is "rarely fillable"


@dataclasses.dataclass
class _Gpu:
    total_units: int
    granted: float = 0.0  # share of its memory granted (units x unit size / memory)
    units: int = 0
    shares: list[int] = dataclasses.field(default_factory=list)  # gpu_milli of the sharing pods on it
    whole: bool = False  # a pod holds it whole (or as one of several GPUs)


@dataclasses.dataclass(frozen=True)
class Stranded:
    """One replay's unallocated GPU memory, in GPUs."""

    configuration: str
    seed: int
    total_gpus: int
    granted_gpus: float
    idle_gpus: int  # nothing placed on them
    partly_used: int  # GPUs with a free share left
    free_on_partly_used: float
    rarely_fillable: float  # ... in holes that at most _RARE of the sharing pods would fit
    unfillable: float  # ... in holes no sharing pod of the replay would fit
    by_contents: list[tuple[float, int, int, tuple[int, ...]]]  # (free GPUs, GPUs, units, shares), largest first

    @property
    def unallocated(self) -> float:
        return self.total_gpus - self.granted_gpus


def stranded(text_lines: Iterable[str]) -> list[Stranded]:
    """Every replay's unallocated memory in a placements file, by where it sits."""
    runs: dict[tuple[str, int], dict[str, Any]] = {}
    gpus: dict[tuple[str, int], dict[tuple[str, str], _Gpu]] = {}
    asked: dict[tuple[str, int], list[int]] = {}  # gpu_milli of every sharing pod that arrived
    granted_units: dict[tuple[str, int], dict[tuple[int, int], int]] = {}  # (milli, total units) -> fewest units
    for number, key, line in placements.records(text_lines):
        if line["record"] == "run":
            runs[key] = line
            gpus[key], asked[key], granted_units[key] = {}, [], {}
            continue
        try:
            _add_pod(line, gpus[key], asked[key], granted_units[key])
        except (ValueError, KeyError, TypeError) as exc:
            raise PlacementsError(f"line {number}: not a placements line ({exc!r})") from None
    return [_summary(key, runs[key], gpus[key], asked[key], granted_units[key]) for key in runs]


def _add_pod(
    line: dict[str, Any], gpus: dict[tuple[str, str], _Gpu], asked: list[int], fewest: dict[tuple[int, int], int]
) -> None:
    sharing = line["num_gpu"] == 1 and 0 < line["gpu_milli"] < 1000
    if sharing:
        asked.append(line["gpu_milli"])
    if line["outcome"] != "placed":
        return
    for held in line["gpus"]:
        gpu = gpus.setdefault((line["node"], held["uuid"]), _Gpu(int(held["total_units"])))
        gpu.granted += held["units"] * held["unit_mib"] / held["gpu_memory_mib"]
        gpu.units += held["units"]
        if sharing:
            gpu.shares.append(line["gpu_milli"])
            need = (line["gpu_milli"], gpu.total_units)
            fewest[need] = min(fewest.get(need, held["units"]), held["units"])
        else:
            gpu.whole = True


def _summary(
    key: tuple[str, int],
    run: dict[str, Any],
    gpus: dict[tuple[str, str], _Gpu],
    asked: list[int],
    fewest: dict[tuple[int, int], int],
) -> Stranded:
    sizes = sorted(collections.Counter(asked).items())  # (milli, pods)
    fits_cache: dict[tuple[int, int], float] = {}

    def fitting(free_units: int, total_units: int) -> float:
        """Share of the replay's sharing pods that would fit in `free_units` of a GPU of that size."""
        cached = fits_cache.get((free_units, total_units))
        if cached is None:
            fit = sum(
                pods
                for milli, pods in sizes
                if fewest.get((milli, total_units), milli * total_units // 1000) <= free_units
            )
            cached = fits_cache[(free_units, total_units)] = fit / len(asked) if asked else 0.0
        return cached

    free_total = rare = never = 0.0
    partly = 0
    contents: dict[tuple[int, tuple[int, ...]], list[float]] = {}
    for gpu in gpus.values():
        free = max(0.0, 1.0 - gpu.granted)
        if free <= 0.0 or gpu.whole:
            continue
        partly += 1
        free_total += free
        share = fitting(gpu.total_units - gpu.units, gpu.total_units)
        if share <= _RARE:
            rare += free
        if share == 0.0:
            never += free
        entry = contents.setdefault((gpu.total_units, tuple(sorted(gpu.shares))), [0.0, 0])
        entry[0] += free
        entry[1] += 1
    by_contents = sorted(
        ((free, int(count), units, shares) for (units, shares), (free, count) in contents.items()), reverse=True
    )
    return Stranded(
        configuration=key[0],
        seed=key[1],
        total_gpus=int(run["total_gpus"]),
        granted_gpus=sum(min(1.0, g.granted) for g in gpus.values()),
        idle_gpus=int(run["total_gpus"]) - len(gpus),
        partly_used=partly,
        free_on_partly_used=free_total,
        rarely_fillable=rare,
        unfillable=never,
        by_contents=by_contents,
    )


def _percent_of(part: float, whole: int) -> str:
    return f"{part:7.1f} GPUs ({100 * part / whole:4.2f} points)" if whole else f"{part:7.1f} GPUs"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpuslice.sim.stranded",
        description="Where a replay's unallocated GPU memory sits, from a gpuslice-sim --placements file.",
    )
    parser.add_argument("file", help="the file written by gpuslice-sim --placements")
    parser.add_argument("--top", type=int, default=8, help="GPU contents to list per replay (default 8)")
    args = parser.parse_args(argv)
    if args.top < 0:
        parser.error("--top must be 0 or more")
    try:
        with pathlib.Path(args.file).open(encoding="utf-8") as handle:
            runs = stranded(handle)
    except (OSError, PlacementsError) as exc:
        print(f"stranded: {args.file}: {exc}", file=sys.stderr)
        return 2
    for run in runs:
        whole = run.total_gpus
        print(f"{run.configuration}, seed {run.seed}: {whole} GPUs, granted {100 * run.granted_gpus / whole:.2f} %")
        print(f"  unallocated                      {_percent_of(run.unallocated, whole)}")
        print(f"  idle GPUs                        {run.idle_gpus:7d}")
        print(f"  free on {run.partly_used:5d} partly used GPUs {_percent_of(run.free_on_partly_used, whole)}")
        print(f"    where <= {_RARE:.0%} of its sharing pods fit {_percent_of(run.rarely_fillable, whole)}")
        print(f"    where none of them fits        {_percent_of(run.unfillable, whole)}")
        for free, count, units, shares in run.by_contents[: args.top]:
            held = " + ".join(str(s) for s in shares) or "(whole-GPU pods only)"
            print(f"    {free:7.1f} GPUs free on {count:5d} GPUs of {units:3d} units holding {held}")
    if len(runs) > 1:
        total = sum(r.total_gpus for r in runs)
        print(
            f"all {len(runs)} replays: unallocated {100 * sum(r.unallocated for r in runs) / total:.2f} points, "
            f"of which on partly used GPUs {100 * sum(r.free_on_partly_used for r in runs) / total:.2f}, "
            f"where <= {_RARE:.0%} of the sharing pods fit {100 * sum(r.rarely_fillable for r in runs) / total:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
