"""`gpuslice-sim`: replay the Alibaba GPU trace through the webhook conversion, the kube-scheduler
model and the device plugin's allocation, for each compared configuration, and print the GPU
allocation ratio beside the FGD paper's published figures (docs/simulator.md).

Wiring only: parse the command line, build the Config once, run sim.replay per configuration and
seed (--seeds; in worker processes with --jobs) with a progress bar on a terminal (sim.progress),
print (text, --json; several seeds: means, spread and per-seed figures) and draw (--plot, needs the
`plot` extra; checked before replaying).

May import numpy, gpuslice.config and the other gpuslice.sim modules.
"""

from __future__ import annotations

import argparse
import collections
import csv
import importlib
import json
import multiprocessing
import os
import pathlib
import statistics
import sys
from collections.abc import Mapping, Sequence
from concurrent import futures
from typing import Any

import numpy as np

from gpuslice import config
from gpuslice.sim import fgd, kube_cli, placements, progress, provenance, replay, trace

__all__ = ["PaperFigures", "main", "paper_figures", "parse_args", "plot_problem"]

KNOWN_CONFIGURATIONS = replay.CONFIGURATION_NAMES + fgd.CONFIGURATION_NAMES
PAPER_POLICIES = ("01-Random", "02-DotProd", "03-GpuClustering", "04-GpuPacking", "05-BestFit", "06-FGD")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="gpuslice-sim",
        description="Pack the Alibaba GPU trace with the stock scheduler model: whole GPUs vs gpuslice.",
    )
    parser.add_argument("--trace-dir", metavar="DIR", help="cluster-trace-gpu-v2023 csv folder [GPUSLICE_TRACE_DIR]")
    parser.add_argument("--pods", metavar="FILE", help=f"pod list (default: {trace.DEFAULT_POD_FILE} in the trace dir)")
    parser.add_argument(
        "--nodes", metavar="FILE", help=f"node list (default: {trace.DEFAULT_NODE_FILE} in the trace dir)"
    )
    parser.add_argument("--seed", type=int, default=42, help="shuffle, resampling and tie-break seed (default 42)")
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        metavar="N",
        help="replay seeds --seed .. --seed+N-1 and report their mean (default 1; the FGD paper: 10, seeds 42..51)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        metavar="J",
        help="worker processes for the (seed, configuration) replays (default: one per replay, at most the CPU count)",
    )
    parser.add_argument("--demand", type=float, default=1.3, help="arrived GPU demand / cluster GPUs (default 1.3)")
    parser.add_argument(
        "--configs",
        default=",".join(replay.CONFIGURATION_NAMES),
        help="comma-separated configurations to compare (default: all of "
        + ", ".join(replay.CONFIGURATION_NAMES)
        + "; also "
        + ", ".join(fgd.CONFIGURATION_NAMES)
        + ": the FGD paper's policy in its own model, docs/simulator.md)",
    )
    parser.add_argument(
        "--label-delay-binds", type=int, default=0, help="binds before a node's new labels are seen (default 0)"
    )
    parser.add_argument(
        "--label-delay-seconds",
        type=float,
        default=0.0,
        help="simulated seconds before a node's new labels are seen (pods arrive --pod-interval apart; default 0)",
    )
    parser.add_argument(
        "--pod-interval", type=float, default=1.0, help="simulated seconds between arrivals (default 1)"
    )
    parser.add_argument(
        "--percentage-of-nodes-to-score",
        type=int,
        help="kube-scheduler's percentageOfNodesToScore (0, the default: its adaptive default; 100: every node; "
        "the fgd-* configurations score every node unless this is given)",
    )
    parser.add_argument(
        "--binpack-strategy",
        choices=("MostAllocated", "RequestedToCapacityRatio"),
        default="MostAllocated",
        help="scoring strategy of the gpuslice-binpack profile (default MostAllocated)",
    )
    parser.add_argument(
        "--fgd-score",
        choices=("kube", "exact"),
        default="kube",
        help="how the fgd-* configurations rank nodes: kube (default), the 0..100 integer score a kube-scheduler "
        "plugin answers, as the paper's simulator did; exact, by the exact growth of expected fragmentation",
    )
    parser.add_argument(
        "--fgd-popularity-threshold",
        type=float,
        default=fgd.POPULARITY_THRESHOLD * 100,
        metavar="PERCENT",
        help="the fgd-* configurations weigh the most common task types that together hold this percent of "
        f"the trace's pods (the paper's podPopularityThreshold; default {fgd.POPULARITY_THRESHOLD * 100:g}, "
        "docs/simulator.md says why)",
    )
    parser.add_argument(
        "--paper-dir", metavar="DIR", help="FGD paper results (default: fgd-paper-results beside the trace)"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="draw allocation ratio against arrived demand (matplotlib)")
    parser.add_argument(
        "--placements",
        metavar="FILE",
        help="write one JSON line per pod (outcome, node, GPUs and units granted, requested milli) to FILE; "
        "with --scheduler kube, what the real scheduler bound and the node plugins granted; "
        "python -m gpuslice.sim.placements FILE recomputes the figures from it",
    )
    kube_cli.add_arguments(parser)
    config.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.demand <= 0:
        parser.error(f"--demand must be greater than 0, got {args.demand}")
    if not 0 < args.fgd_popularity_threshold <= 100:
        parser.error(f"--fgd-popularity-threshold must be in (0, 100], got {args.fgd_popularity_threshold:g}")
    if args.seeds < 1:
        parser.error(f"--seeds must be at least 1, got {args.seeds}")
    if args.jobs is not None and args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    if args.label_delay_binds < 0 or args.label_delay_seconds < 0 or args.pod_interval < 0:
        parser.error("--label-delay-binds, --label-delay-seconds and --pod-interval must not be negative")
    given = args.percentage_of_nodes_to_score
    if given is not None and not 0 <= given <= 100:
        parser.error("--percentage-of-nodes-to-score must be 0..100")
    args.percentage_of_nodes_to_score = 0 if given is None else given
    # FGD's paper ran with every node scored; the flag, when given, applies to it too.
    args.fgd_percentage_of_nodes_to_score = 100 if given is None else given
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in KNOWN_CONFIGURATIONS]
    if unknown or not names:
        parser.error(
            f"--configs: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(KNOWN_CONFIGURATIONS)}"
        )
    model_only = [n for n in names if n in fgd.CONFIGURATION_NAMES]
    if model_only and args.scheduler == "kube":
        parser.error(
            f"--configs {', '.join(model_only)}: only with --scheduler model (FGD has no real-scheduler plugin here)"
        )
    args.config_names = names
    return args


# --- the paper's figures ---------------------------------------------------------------------


class PaperFigures:
    """FGD paper results for one workload: summary rows and mean curves per policy."""

    def __init__(self, summary: dict[str, dict[str, float]], curves: dict[str, list[float]]) -> None:
        self.summary = summary  # policy -> {alloc_pct_at_arrive100, alloc_pct_at_arrive130, unallocated_gpus_at_130}
        self.curves = curves  # policy -> allocation ratio 0..1 per percent of arrived demand


PAPER_SUMMARY_FILE = "summary_alloc_at_130pct.csv"
PAPER_CURVES_FILE = "analysis_allo_discrete.csv"


def paper_figures(directory: pathlib.Path, workload: str, *, with_curves: bool) -> PaperFigures | None:
    """The paper's figures for `workload` from `directory`: the summary file, or without it the same
    means over the seeds computed from the curves file (docs/simulator.md, "Reproducing the
    headline"); None when neither file is there."""
    summary_file = directory / PAPER_SUMMARY_FILE
    curve_file = directory / PAPER_CURVES_FILE
    have_summary = summary_file.is_file()
    runs = _paper_runs(curve_file, workload) if (with_curves or not have_summary) and curve_file.is_file() else None
    summary: dict[str, dict[str, float]] = {}
    if have_summary:
        with summary_file.open(newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                if row["workload"] == workload:
                    summary[row["policy"]] = {
                        k: float(row[k])
                        for k in ("alloc_pct_at_arrive100", "alloc_pct_at_arrive130", "unallocated_gpus_at_130")
                    }
    elif runs is not None:
        summary = {policy: _paper_summary(seeds) for policy, seeds in runs.items()}
    else:
        return None
    curves: dict[str, list[float]] = {}
    if with_curves and runs:
        for policy, seeds in runs.items():
            width = min(len(values) for _, values in seeds)
            curves[policy] = list(np.mean([values[:width] for _, values in seeds], axis=0) / 100)
    return PaperFigures(summary, curves)


def _paper_runs(curve_file: pathlib.Path, workload: str) -> dict[str, list[tuple[int, list[float]]]]:
    """Policy -> one (total GPUs, allocation ratio in percent per percent of arrived demand) per seed,
    of the workload's runs at 130 % (the file's `tune` 1.3)."""
    runs: dict[str, list[tuple[int, list[float]]]] = {}
    with curve_file.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        first, gpus = header.index("0"), header.index("total_gpus")
        tune = header.index("tune") if "tune" in header else None
        for fields in reader:
            if fields[0] == workload and (tune is None or float(fields[tune]) == 1.3):
                values = [float(v) for v in fields[first:] if v != ""]
                runs.setdefault(fields[1], []).append((int(float(fields[gpus])), values))
    return runs


def _paper_summary(seeds: Sequence[tuple[int, list[float]]]) -> dict[str, float]:
    """The summary file's row for one policy: means over the seeds, to the hundredth (a mean that
    ends in 5 at the thousandth may be rounded the other way than in the summary file)."""
    unallocated = statistics.fmean(gpus * (1 - values[130] / 100) for gpus, values in seeds)
    return {
        "alloc_pct_at_arrive100": round(statistics.fmean(values[100] for _, values in seeds), 2),
        "alloc_pct_at_arrive130": round(statistics.fmean(values[130] for _, values in seeds), 2),
        "unallocated_gpus_at_130": float(round(unallocated)),
    }


# --- output ----------------------------------------------------------------------------------


def _text_report(
    results: Sequence[replay.Result], paper: PaperFigures | None, meta: Mapping[str, Any], paper_dir: pathlib.Path
) -> str:
    lines = [
        (
            f"gpuslice-sim: {meta['pods_file']} ({meta['arrivals']} pods at {meta['demand']:.0%} of GPU capacity, "
            f"seed {meta['seed']}) on {meta['nodes']} nodes / {meta['gpus']} GPUs"
        ),
        "",
        (
            f"{'configuration':<20}{'alloc@100%':>11}{'alloc@130%':>11}{'unalloc GPUs':>13}{'fragmented':>11}"
            f"{'failed':>8}{'admission':>10}{'denied':>8}{'runtime':>9}{'requested@130%':>15}"
        ),
    ]
    for r in results:
        lines.append(
            f"{r.name:<20}{r.at_demand(100):>11.2%}{r.gpu_allocation_ratio:>11.2%}{r.unallocated_gpus:>13.0f}"
            f"{r.fragmented_gpus:>11.0f}{r.failed_pods:>8}{r.admission_failures:>10}{r.denied_pods:>8}{r.runtime_s:>8.1f}s"
            f"{r.requested_allocation_ratio:>15.2%}"
        )
    lines += _paper_lines(paper, gap=0, directory=paper_dir)
    for r in results:
        lines += _admission_lines(r.name, [r])
    lines += ["", f"{_ALLOC}; {_REQUESTED}; fragmented = unallocated share on GPUs that hold a pod; {_ADMISSION}"]
    return "\n".join(lines)


_ALLOC = (
    "alloc = GPU memory kubelet granted (units x unit size / the GPU's memory, at most 1 per GPU) / GPUs, "
    "when that share of demand has arrived"
)
_REQUESTED = (
    "requested = sum of gpu_milli of placed pods / (GPUs x 1000), the FGD paper's accounting "
    "(a gpu-fraction pod is granted floor(fraction x units), so it holds less than it asked for; "
    "with whole-gpu a sharing pod holds a whole GPU, so there alloc counts GPUs handed out)"
)
_ADMISSION = "admission = passed the scheduler, refused by kubelet."
_RANGE_WIDTH = 16  # the min–max column of the multi-seed report; the paper's rows leave it blank


def _seeds_report(
    document: Mapping[str, Any],
    results: Sequence[Sequence[replay.Result]],
    paper: PaperFigures | None,
    paper_dir: pathlib.Path,
) -> str:
    """One row per configuration, aggregated over the seeds, then the paper's rows (also seed means)."""
    seeds, arrivals = document["seeds"], document["arrivals"]
    pods = f"{min(arrivals)}" if min(arrivals) == max(arrivals) else f"{min(arrivals)}–{max(arrivals)}"
    lines = [
        (
            f"gpuslice-sim: {document['pods_file']} ({pods} pods at {document['demand']:.0%} of GPU capacity, "
            f"{_seeds_label(seeds)}) on {document['nodes']} nodes / {document['gpus']} GPUs"
        ),
        "",
        (
            f"{'configuration':<20}{'alloc@100%':>11}{'alloc@130%':>11}{'min–max@130%':>{_RANGE_WIDTH}}"
            f"{'unalloc GPUs':>13}{'failed':>8}{'admission':>10}{'denied':>8}{'cpu':>9}{'requested@130%':>15}"
        ),
    ]
    for c in document["configurations"]:
        spread = f"{c['gpu_allocation_ratio_min']:.2%}–{c['gpu_allocation_ratio_max']:.2%}"
        lines.append(
            f"{c['name']:<20}{c['at_demand_100']:>11.2%}{c['gpu_allocation_ratio']:>11.2%}{spread:>{_RANGE_WIDTH}}"
            f"{c['unallocated_gpus']:>13.0f}{c['failed_pods']:>8.1f}{c['admission_failures']:>10}"
            f"{c['denied_pods']:>8}{c['cpu_s']:>8.1f}s{c['requested_allocation_ratio']:>15.2%}"
        )
    lines += _paper_lines(paper, gap=_RANGE_WIDTH, directory=paper_dir)
    for c, per_seed in zip(document["configurations"], results, strict=True):
        lines += _admission_lines(c["name"], per_seed)
    lines += [
        "",
        f"{_ALLOC}; {_REQUESTED}; {_ADMISSION}",
        (
            "alloc, unalloc GPUs and failed are means over the seeds, like the paper's; min–max = lowest and highest "
            "seed; admission and denied = totals over all seeds; cpu = total CPU time of the replays."
        ),
    ]
    return "\n".join(lines)


def _paper_lines(paper: PaperFigures | None, *, gap: int, directory: pathlib.Path) -> list[str]:
    """The paper's rows under ours; `gap` blank columns keep its unallocated GPUs under ours."""
    if paper is None:
        return [
            "",
            f"(FGD paper figures not found: neither {PAPER_SUMMARY_FILE} nor {PAPER_CURVES_FILE} is in {directory}."
            " They are the paper's published results (hkust-adsl/kubernetes-scheduler-simulator,"
            " experiments/analysis/expected_results); pass their folder as --paper-dir DIR: docs/simulator.md,"
            ' "Reproducing the headline".)',
        ]
    if not paper.summary:
        return []
    lines = ["", "FGD paper (USENIX ATC'23), same workload, mean of 10 seeds, own simulator:"]
    for policy in PAPER_POLICIES:
        row = paper.summary.get(policy)
        if row:
            lines.append(
                f"  {policy[3:]:<18}{row['alloc_pct_at_arrive100'] / 100:>11.2%}"
                f"{row['alloc_pct_at_arrive130'] / 100:>11.2%}{'':>{gap}}{row['unallocated_gpus_at_130']:>13.0f}"
            )
    return lines


def _admission_lines(name: str, results: Sequence[replay.Result]) -> list[str]:
    """The two commonest admission failure kinds of a configuration, summed over its seeds."""
    reasons: collections.Counter[str] = collections.Counter()
    for r in results:
        reasons.update(r.admission_reasons)
    return [f"{name}: {count} admission failure(s): {message}" for message, count in reasons.most_common(2)]


PLOT_EXTRA_HINT = "install the plot extra from this repository: .venv/bin/pip install -e '.[plot]'"


def plot_problem(path: str) -> str | None:
    """Why --plot `path` cannot be drawn (matplotlib missing, the file not writable), or None. Asked
    before replaying, so a long run never ends in a missing import or a bad path."""
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        return f"--plot needs matplotlib, which is not installed; {PLOT_EXTRA_HINT}"
    target = pathlib.Path(path)
    folder = target.parent
    if target.is_dir():
        return f"--plot {path}: is a directory"
    if not folder.is_dir():
        return f"--plot {path}: no directory {folder}"
    if not os.access(target if target.exists() else folder, os.W_OK):
        return f"--plot {path}: not writable"
    return None


def _plot(path: str, curves: Sequence[tuple[str, Sequence[float]]], paper: PaperFigures | None, title: str) -> None:
    import matplotlib  # plot_problem made sure it is there

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(8, 5))
    for name, curve in curves:
        axes.plot(range(len(curve)), [100 * v for v in curve], label=name, linewidth=2)
    if paper:
        for policy, curve in sorted(paper.curves.items()):
            axes.plot(
                range(len(curve)), [100 * v for v in curve], label=f"paper: {policy[3:]}", linestyle="--", linewidth=1
            )
    axes.set_xlabel("arrived GPU demand (% of cluster GPUs)")
    axes.set_ylabel("GPU allocation ratio (%)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)


# --- several seeds ---------------------------------------------------------------------------


def _seeds_label(seeds: Sequence[int]) -> str:
    return f"mean of {len(seeds)} seeds ({seeds[0]}–{seeds[-1]})"


def _aggregate(seeds: Sequence[int], results: Sequence[replay.Result]) -> dict[str, Any]:
    """One configuration over several seeds. Means are what the paper reports, min/max/stdev the
    spread; admission failures and denials are totals because the bar for them is zero."""
    ratios = [r.gpu_allocation_ratio for r in results]
    width = min(len(r.allocation_curve) for r in results)  # each seed's curve ends where its demand did
    curve = np.mean([r.allocation_curve[:width] for r in results], axis=0)
    return {
        "name": results[0].name,
        "gpu_allocation_ratio": round(statistics.fmean(ratios), 6),
        "gpu_allocation_ratio_min": round(min(ratios), 6),
        "gpu_allocation_ratio_max": round(max(ratios), 6),
        "gpu_allocation_ratio_stdev": round(statistics.stdev(ratios), 6),
        "at_demand_100": round(statistics.fmean(r.at_demand(100) for r in results), 6),
        "requested_allocation_ratio": round(statistics.fmean(r.requested_allocation_ratio for r in results), 6),
        "requested_allocation_ratio_min": round(min(r.requested_allocation_ratio for r in results), 6),
        "requested_allocation_ratio_max": round(max(r.requested_allocation_ratio for r in results), 6),
        "requested_at_demand_100": round(statistics.fmean(r.at_demand(100, requested=True) for r in results), 6),
        "gpus_over_requested": round(statistics.fmean(r.gpus_over_requested for r in results), 3),
        "failed_pods": round(statistics.fmean(r.failed_pods for r in results), 3),
        "admission_failures": sum(r.admission_failures for r in results),
        "denied_pods": sum(r.denied_pods for r in results),
        "unallocated_gpus": round(statistics.fmean(r.unallocated_gpus for r in results), 3),
        "fragmented_gpus": round(statistics.fmean(r.fragmented_gpus for r in results), 3),
        "runtime_s": round(sum(r.runtime_s for r in results), 3),
        "cpu_s": round(sum(r.cpu_s for r in results), 3),
        "allocation_curve": [round(float(v), 6) for v in curve],
        "seeds": [_seed_entry(seed, r) for seed, r in zip(seeds, results, strict=True)],
    }


def _seed_entry(seed: int, result: replay.Result) -> dict[str, Any]:
    """One seed's figures; its curves are left out to keep the document small (the mean curve stays)."""
    entry = {
        "seed": seed,
        **result.to_json(),
        "at_demand_100": round(result.at_demand(100), 6),
        "requested_at_demand_100": round(result.at_demand(100, requested=True), 6),
    }
    del entry["allocation_curve"], entry["requested_allocation_curve"]
    return entry


def _workload(
    pods: Sequence[trace.TracePod], capacity: int, demand: float, seed: int, pods_file: pathlib.Path
) -> list[trace.TracePod]:
    """The seed's arrival order; a pod list that cannot be resampled is a trace error, not a crash."""
    try:
        return replay.workload(pods, capacity, demand, np.random.default_rng(seed))
    except ValueError as exc:
        raise trace.TraceError(f"{pods_file}: {exc}") from None


Chosen = replay.Configuration | fgd.Policy


def _replay_one(
    nodes: Sequence[trace.TraceNode],
    arrivals: Sequence[trace.TracePod],
    chosen: Chosen,
    *,
    seed: int,
    label_delay: replay.LabelDelay,
    placements: bool,
    progress: Any = None,
) -> replay.Result:
    """One replay: the gpuslice model's (webhook, scheduler, kubelet) or FGD's own (sim/fgd.py)."""
    if isinstance(chosen, fgd.Policy):
        return fgd.replay_fgd(nodes, arrivals, chosen, seed=seed, placements=placements, progress=progress)
    return replay.replay(
        nodes, arrivals, chosen, seed=seed, label_delay=label_delay, placements=placements, progress=progress
    )


def _worker_context() -> multiprocessing.context.BaseContext:
    """Where worker processes come from: a fork server (a fresh interpreter that forks them), or
    spawned where there is none; never a fork of this process. A fork copies the state of every
    thread the parent has (gRPC's above all: forked workers crashed or spun in their garbage
    collector on the gRPC objects of the process that forked them, and the pool then hung)."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def _replay_all(
    nodes: Sequence[trace.TraceNode],
    arrivals: Mapping[int, Sequence[trace.TracePod]],
    chosen: Sequence[Chosen],
    delay: replay.LabelDelay,
    jobs: int | None,
    *,
    record: bool = False,
) -> list[list[replay.Result]]:
    """results[configuration][seed], in that order. A replay depends only on its seed's arrivals and
    tie-break generator, so worker processes change the time taken, not the results."""
    tasks = [(c, seed) for c in chosen for seed in arrivals]
    workers = min(jobs if jobs is not None else (os.cpu_count() or 1), len(tasks))
    total = sum(len(arrivals[seed]) for _, seed in tasks)
    with progress.bar(total, "replaying") as shown:
        if workers == 1:
            flat = [
                _replay_one(
                    nodes, arrivals[seed], c, seed=seed, label_delay=delay, placements=record, progress=shown.update
                )
                for c, seed in tasks
            ]
        else:
            pool = futures.ProcessPoolExecutor(max_workers=workers, mp_context=_worker_context())
            try:
                pending = [
                    pool.submit(_replay_one, nodes, arrivals[seed], c, seed=seed, label_delay=delay, placements=record)
                    for c, seed in tasks
                ]
                # A worker cannot reach the bar: it moves by a whole replay's pods as each one ends.
                pods_of = {f: len(arrivals[seed]) for f, (_, seed) in zip(pending, tasks, strict=True)}
                for done in futures.as_completed(pending):
                    done.result()  # re-raises a worker's TraceError / ConfigError here
                    shown.update(pods_of[done])
                flat = [f.result() for f in pending]
            finally:
                pool.shutdown(cancel_futures=True)  # after an error, start none of the rest
    per_configuration = len(arrivals)
    return [flat[i : i + per_configuration] for i in range(0, len(flat), per_configuration)]


def _write_placements(
    path: str, seeds: Sequence[int], pods_file: str, results: Sequence[Sequence[replay.Result]]
) -> None:
    runs = ((rs[0].name, seed, pods_file, r) for rs in results for seed, r in zip(seeds, rs, strict=True))
    try:
        with pathlib.Path(path).open("w", encoding="utf-8") as handle:
            placements.write(handle, runs)
    except OSError as exc:
        raise trace.TraceError(f"--placements {path}: {exc.strerror or exc}") from None


# --- entry point -------------------------------------------------------------------------


def run(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, Any]:
    """Load the trace, replay every chosen configuration for every seed; returns the JSON document."""
    settings = config.from_args(args, environ)
    nodes_file, pods_file = trace.trace_files(args.nodes, args.pods, args.trace_dir, environ, provenance.SOURCE)
    nodes = trace.load_nodes(nodes_file)
    pods = trace.load_pods(pods_file)
    capacity = replay.gpu_capacity_milli(nodes)
    if capacity == 0:
        raise trace.TraceError(f"{nodes_file}: no GPU nodes")
    commit = provenance.source_commit()  # now: the code the replays run, not what is there after them
    seeds = list(range(args.seed, args.seed + args.seeds))
    # Drawn once per seed here and shared by the configurations, exactly as a single-seed run does.
    arrivals = {seed: _workload(pods, capacity, args.demand, seed, pods_file) for seed in seeds}
    delay = replay.LabelDelay(args.label_delay_binds, args.label_delay_seconds, args.pod_interval)
    chosen: dict[str, Chosen] = dict(
        replay.configurations(
            settings,
            percentage_of_nodes_to_score=args.percentage_of_nodes_to_score,
            binpack_strategy=args.binpack_strategy,
        )
    )
    if any(name in fgd.CONFIGURATION_NAMES for name in args.config_names):
        # FGD expects the trace's own pod mix (its task types weighted by their counts).
        chosen.update(
            fgd.policies(
                pods,
                percentage_of_nodes_to_score=args.fgd_percentage_of_nodes_to_score,
                scored=args.fgd_score == "kube",
                popularity=args.fgd_popularity_threshold / 100,
            )
        )
    results = _replay_all(
        nodes, arrivals, [chosen[name] for name in args.config_names], delay, args.jobs, record=bool(args.placements)
    )
    if args.placements:
        _write_placements(args.placements, seeds, pods_file.name, results)
    paper_dir = pathlib.Path(args.paper_dir) if args.paper_dir else (nodes_file.parent.parent / "fgd-paper-results")
    paper = paper_figures(paper_dir, pods_file.stem, with_curves=bool(args.plot))
    single = len(seeds) == 1
    meta = {
        "pods_file": pods_file.name,
        "nodes": len(nodes),
        "gpus": capacity // 1000,
        "arrivals": len(arrivals[args.seed]) if single else [len(arrivals[seed]) for seed in seeds],
        "demand": args.demand,
        "seed": args.seed,
        **({} if single else {"seeds": seeds}),
        "steering": settings.steering.enabled,
        "commit": commit,
        "label_delay": {
            "binds": delay.binds,
            "seconds": delay.seconds,
            "pod_interval_seconds": delay.pod_interval_seconds,
        },
    }
    entries = [rs[0].to_json() for rs in results] if single else [_aggregate(seeds, rs) for rs in results]
    document: dict[str, Any] = {**meta, "configurations": entries}
    if paper:
        document["paper"] = {p[3:]: paper.summary[p] for p in PAPER_POLICIES if p in paper.summary}
    document["_results"] = results
    document["_paper"] = paper
    document["_paper_dir"] = paper_dir
    return document


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.scheduler == "kube":
        if args.plot:
            # Said at once rather than ignored: the kube replay draws nothing (its --json has the curves).
            print("gpuslice-sim: --plot: only with --scheduler model", file=sys.stderr)
            return 2
        return kube_cli.main(args, os.environ)
    problem = plot_problem(args.plot) if args.plot else None
    if problem:
        print(f"gpuslice-sim: {problem}", file=sys.stderr)
        return 2
    try:
        document = run(args, os.environ)
    except (trace.TraceError, config.ConfigError) as exc:
        print(f"gpuslice-sim: {exc}", file=sys.stderr)
        return 2
    results = document.pop("_results")  # results[configuration][seed]
    paper = document.pop("_paper")
    paper_dir = document.pop("_paper_dir")
    seeds = document.get("seeds")
    if args.plot:
        curves = [(c["name"], c["allocation_curve"]) for c in document["configurations"]]
        title = f"{document['pods_file']}, " + (_seeds_label(seeds) if seeds else f"seed {args.seed}")
        _plot(args.plot, curves, paper, title)
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        if seeds:
            print(_seeds_report(document, results, paper, paper_dir))
        else:
            print(_text_report([rs[0] for rs in results], paper, document, paper_dir))
        if args.plot:
            print(f"plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
