"""`python -m gpuslice.sim.summary RUN.json ...`: the real-scheduler replays of many workloads and
seeds (each `gpuslice-sim --scheduler kube --json` output one file) as one markdown table, one row
per workload, beside the Python model's figure for the same seeds and FGD's published one.

Replays of one workload take long (minutes each), so they are run one at a time, often across
days; this puts them back together. Every figure is the granted allocation ratio at the trace's
demand (130 %), as `gpuslice-sim` reports it; refusals and lost pods are summed over the seeds.
Two files with the same workload, seed, arrival mode and resource mode are refused (which one
counts would be a guess): keep the runs of one version of the code in one set of files. Each row
names the commits its runs came from (outputs record theirs since the `commit` field was added).

May import gpuslice.sim.main (the paper's figures) only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from gpuslice.sim import main as sim_main

__all__ = ["Row", "Run", "SummaryError", "load", "main", "rows", "table"]

# The order of the FGD paper's tables; other workloads follow by name.
WORKLOAD_ORDER = (
    "default",
    "cpu050",
    "cpu100",
    "cpu200",
    "cpu250",
    "gpushare40",
    "gpushare60",
    "gpushare80",
    "gpushare100",
    "gpuspec10",
    "gpuspec20",
    "gpuspec25",
    "gpuspec33",
    "multigpu20",
    "multigpu30",
    "multigpu40",
    "multigpu50",
)
_POD_FILE_PREFIX = "openb_pod_list_"
FGD_POLICY = sim_main.PAPER_POLICIES[-1]  # "06-FGD", as the paper's results name it


class SummaryError(Exception):
    """A file is not a `gpuslice-sim --scheduler kube --json` output, or repeats another's run."""


@dataclasses.dataclass(frozen=True)
class Run:
    """One seed of one workload replayed on the real scheduler."""

    source: str  # the file it came from
    pods_file: str  # the trace's pod file, as the output names it
    workload: str  # its name less `openb_pod_list_` and `.csv`
    arrival: str
    mode: str
    pacing: bool | None  # None: an output from before the field was written
    commit: str | None  # the code's commit (sim/provenance.py); None: not recorded
    seed: int
    granted: float  # percent of the cluster's GPUs
    model: float  # the Python model on the same arrivals, percent
    placed: int
    unschedulable: int
    refused: int  # kubelet refused the pod at admission
    lost: int  # refused and not made again


def workload_of(pods_file: str) -> str:
    stem = pathlib.PurePath(pods_file).stem
    return stem[len(_POD_FILE_PREFIX) :] if stem.startswith(_POD_FILE_PREFIX) else stem


def load(path: pathlib.Path) -> list[Run]:
    """The runs of one output file; SummaryError naming the file and the field when it is not one."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SummaryError(f"{path}: not readable as JSON ({exc})") from None
    try:
        pods_file = str(document["pods_file"])
        runs = []
        for run in document["runs"]:
            kube, model = run["kube"], run["model"]
            runs.append(
                Run(
                    source=str(path),
                    pods_file=pods_file,
                    workload=workload_of(pods_file),
                    arrival=str(run.get("arrival") or document["arrival"]),
                    mode=str(document.get("mode", "device-plugin")),
                    pacing=None if document.get("pacing") is None else bool(document["pacing"]),
                    commit=None if document.get("commit") is None else str(document["commit"]),
                    seed=int(run["seed"]),
                    granted=100 * float(kube["gpu_allocation_ratio"]),
                    model=100 * float(model["gpu_allocation_ratio"]),
                    placed=int(kube["placed_pods"]),
                    unschedulable=int(kube["failed_pods"]),
                    refused=int(kube["admission_failures"]),
                    lost=int(run["lost_pods"]),
                )
            )
    except (KeyError, TypeError, ValueError) as exc:
        raise SummaryError(
            f"{path}: not a `gpuslice-sim --scheduler kube --json` output (missing or bad {exc})"
        ) from None
    if not runs:
        raise SummaryError(f"{path}: holds no runs")
    return runs


@dataclasses.dataclass(frozen=True)
class Row:
    workload: str
    arrival: str
    mode: str
    pacing: bool | None
    runs: tuple[Run, ...]  # by seed
    paper: float | None  # FGD's published figure at 130 %, percent

    @property
    def seeds(self) -> list[int]:
        return [run.seed for run in self.runs]

    @property
    def commits(self) -> str:
        """The commits of the row's runs in seed order, each once; "?" for runs that recorded none."""
        named = dict.fromkeys(run.commit or "?" for run in self.runs)
        return ", ".join(named)

    @property
    def granted(self) -> float:
        return statistics.fmean(run.granted for run in self.runs)

    @property
    def model(self) -> float:
        return statistics.fmean(run.model for run in self.runs)

    @property
    def at_or_above_paper(self) -> int:
        """Seeds whose figure is at or above the paper's (to the hundredth the table prints)."""
        return 0 if self.paper is None else sum(round(run.granted, 2) >= self.paper for run in self.runs)


def rows(runs: Iterable[Run], paper: dict[str, float | None]) -> list[Row]:
    """One row per (workload, arrival, mode, pacing); SummaryError when two runs share a seed there."""
    groups: dict[tuple[str, str, str, bool | None], dict[int, Run]] = {}
    for run in runs:
        group = groups.setdefault((run.workload, run.arrival, run.mode, run.pacing), {})
        if run.seed in group:
            raise SummaryError(
                f"{run.workload} seed {run.seed} ({_conditions(run.arrival, run.mode, run.pacing)}) is in both "
                f"{group[run.seed].source} and {run.source}: pass one of them"
            )
        group[run.seed] = run

    def order(key: tuple[str, str, str, bool | None]) -> tuple[int, str, str, str, int]:
        workload, arrival, mode, pacing = key
        rank = WORKLOAD_ORDER.index(workload) if workload in WORKLOAD_ORDER else len(WORKLOAD_ORDER)
        return (rank, workload, arrival, mode, {False: 0, True: 1, None: 2}[pacing])

    return [
        Row(*key, tuple(group[seed] for seed in sorted(group)), paper.get(key[0]))
        for key, group in sorted(groups.items(), key=lambda item: order(item[0]))
    ]


def _conditions(arrival: str, mode: str, pacing: bool | None) -> str:
    """How the runs of a row were taken: arrival, then the mode and pacing where not the default."""
    parts = [arrival] + ([mode] if mode != "device-plugin" else [])
    parts += {True: ["paced"], False: [], None: ["pacing not recorded"]}[pacing]
    return ", ".join(parts)


def _span(values: Sequence[float]) -> str:
    return f" ({min(values):.2f}-{max(values):.2f})" if len(values) > 1 else ""


def table(table_rows: Sequence[Row]) -> str:
    """The markdown table (figures in percent of the cluster's GPUs, granted memory)."""
    out = [
        "| trace | arrival | seeds | real scheduler, granted (min-max) | model, same seeds | real - model "
        "| placed / unschedulable / refused / lost (all seeds) | FGD paper | real - paper | seeds at or above paper "
        "| commit |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in table_rows:
        granted = [run.granted for run in row.runs]
        seeds = ", ".join(str(seed) for seed in row.seeds)
        counts = " / ".join(
            f"{sum(getattr(run, field) for run in row.runs):,}"
            for field in ("placed", "unschedulable", "refused", "lost")
        )
        paper = "?" if row.paper is None else f"{row.paper:.2f} %"
        versus = "" if row.paper is None else f"{row.granted - row.paper:+.2f}"
        above = "" if row.paper is None else f"{row.at_or_above_paper} of {len(row.runs)}"
        conditions = _conditions(row.arrival, row.mode, row.pacing)
        out.append(
            f"| {row.workload} | {conditions} | {seeds} | **{row.granted:.2f} %**{_span(granted)} "
            f"| {row.model:.2f} % | {row.granted - row.model:+.2f} | {counts} | {paper} | {versus} | {above} "
            f"| {row.commits} |"
        )
    return "\n".join(out)


def paper_figure(paper_dir: pathlib.Path, pods_file: str) -> float | None:
    """FGD's published figure at 130 % for the workload of `pods_file`, percent; None if absent."""
    figures = sim_main.paper_figures(paper_dir, pathlib.PurePath(pods_file).stem, with_curves=False)
    fgd: dict[str, Any] = figures.summary.get(FGD_POLICY, {}) if figures is not None else {}
    value = fgd.get("alloc_pct_at_arrive130")
    return None if value is None else float(value)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpuslice.sim.summary",
        description="Put real-scheduler replays (gpuslice-sim --scheduler kube --json outputs) in one table.",
    )
    parser.add_argument(
        "files", nargs="+", metavar="RUN.json", help="one gpuslice-sim --scheduler kube --json output each"
    )
    parser.add_argument(
        "--paper-dir",
        metavar="DIR",
        default="../shared/data/fgd-paper-results",
        help="FGD paper results (default: %(default)s); without it the paper's columns say ?",
    )
    args = parser.parse_args(argv)
    try:
        runs = [run for name in args.files for run in load(pathlib.Path(name))]
        pods_files = {run.workload: run.pods_file for run in runs}
        paper = {workload: paper_figure(pathlib.Path(args.paper_dir), name) for workload, name in pods_files.items()}
        print(table(rows(runs, paper)))
    except SummaryError as exc:
        print(f"summary: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
