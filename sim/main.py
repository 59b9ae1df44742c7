"""`gpuslice-sim`: replay the Alibaba GPU trace through the webhook conversion, the kube-scheduler
model and the device plugin's allocation, for each compared configuration, and print the GPU
allocation ratio beside the FGD paper's published figures (docs/simulator.md).

Wiring only: parse the command line, build the Config once, run sim.replay per configuration,
print (text, --json) and draw (--plot, needs the `plot` extra).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import pathlib
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gpuslice import config
from gpuslice.sim import replay, trace

__all__ = ["PaperFigures", "main", "paper_figures", "parse_args"]

REPO = pathlib.Path(__file__).resolve().parent.parent
PAPER_POLICIES = ("01-Random", "02-DotProd", "03-GpuClustering", "04-GpuPacking", "05-BestFit", "06-FGD")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="gpuslice-sim",
        description="Pack the Alibaba GPU trace with the stock scheduler model: whole GPUs vs gpuslice.",
    )
    parser.add_argument("--trace-dir", metavar="DIR", help="cluster-trace-gpu-v2023 csv folder [GPUSLICE_TRACE_DIR]")
    parser.add_argument("--pods", metavar="FILE", help=f"pod list (default: {trace.DEFAULT_POD_FILE} in the trace dir)")
    parser.add_argument("--nodes", metavar="FILE", help=f"node list (default: {trace.DEFAULT_NODE_FILE} in the trace dir)")
    parser.add_argument("--seed", type=int, default=42, help="shuffle, resampling and tie-break seed (default 42)")
    parser.add_argument("--demand", type=float, default=1.3, help="arrived GPU demand / cluster GPUs (default 1.3)")
    parser.add_argument(
        "--configs",
        default=",".join(replay.CONFIGURATION_NAMES),
        help="comma-separated configurations to compare (default: all of " + ", ".join(replay.CONFIGURATION_NAMES) + ")",
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
    parser.add_argument("--pod-interval", type=float, default=1.0, help="simulated seconds between arrivals (default 1)")
    parser.add_argument(
        "--percentage-of-nodes-to-score",
        type=int,
        default=0,
        help="kube-scheduler's percentageOfNodesToScore (0: its adaptive default; 100: every node)",
    )
    parser.add_argument(
        "--binpack-strategy",
        choices=("MostAllocated", "RequestedToCapacityRatio"),
        default="MostAllocated",
        help="scoring strategy of the gpuslice-binpack profile (default MostAllocated)",
    )
    parser.add_argument("--paper-dir", metavar="DIR", help="FGD paper results (default: fgd-paper-results beside the trace)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="draw allocation ratio against arrived demand (matplotlib)")
    config.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.demand <= 0:
        parser.error(f"--demand must be greater than 0, got {args.demand}")
    if args.label_delay_binds < 0 or args.label_delay_seconds < 0 or args.pod_interval < 0:
        parser.error("--label-delay-binds, --label-delay-seconds and --pod-interval must not be negative")
    if not 0 <= args.percentage_of_nodes_to_score <= 100:
        parser.error("--percentage-of-nodes-to-score must be 0..100")
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in replay.CONFIGURATION_NAMES]
    if unknown or not names:
        parser.error(f"--configs: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(replay.CONFIGURATION_NAMES)}")
    args.config_names = names
    return args


# --- the paper's figures ---------------------------------------------------------------------


class PaperFigures:
    """FGD paper results for one workload: summary rows and mean curves per policy."""

    def __init__(self, summary: dict[str, dict[str, float]], curves: dict[str, list[float]]) -> None:
        self.summary = summary  # policy -> {alloc_pct_at_arrive100, alloc_pct_at_arrive130, unallocated_gpus_at_130}
        self.curves = curves  # policy -> allocation ratio 0..1 per percent of arrived demand


def paper_figures(directory: pathlib.Path, workload: str, *, with_curves: bool) -> PaperFigures | None:
    summary_file = directory / "summary_alloc_at_130pct.csv"
    if not summary_file.is_file():
        return None
    summary: dict[str, dict[str, float]] = {}
    with summary_file.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row["workload"] == workload:
                summary[row["policy"]] = {
                    k: float(row[k]) for k in ("alloc_pct_at_arrive100", "alloc_pct_at_arrive130", "unallocated_gpus_at_130")
                }
    curves: dict[str, list[float]] = {}
    curve_file = directory / "analysis_allo_discrete.csv"
    if with_curves and curve_file.is_file():
        rows: dict[str, list[list[float]]] = {}
        with curve_file.open(newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle)
            header = next(reader)
            first = header.index("0")
            for fields in reader:
                if fields[0] == workload:
                    rows.setdefault(fields[1], []).append([float(v) for v in fields[first:] if v != ""])
        for policy, values in rows.items():
            width = min(len(v) for v in values)
            curves[policy] = list(np.mean([v[:width] for v in values], axis=0) / 100)
    return PaperFigures(summary, curves)


# --- output ----------------------------------------------------------------------------------


def _text_report(
    results: Sequence[replay.Result], paper: PaperFigures | None, meta: Mapping[str, Any]
) -> str:
    lines = [
        (
            f"gpuslice-sim: {meta['pods_file']} ({meta['arrivals']} pods at {meta['demand']:.0%} of GPU capacity, "
            f"seed {meta['seed']}) on {meta['nodes']} nodes / {meta['gpus']} GPUs"
        ),
        "",
        (
            f"{'configuration':<20}{'alloc@100%':>11}{'alloc@130%':>11}{'unalloc GPUs':>13}{'fragmented':>11}"
            f"{'failed':>8}{'admission':>10}{'denied':>8}{'runtime':>9}"
        ),
    ]
    for r in results:
        lines.append(
            f"{r.name:<20}{r.at_demand(100):>11.2%}{r.gpu_allocation_ratio:>11.2%}{r.unallocated_gpus:>13.0f}"
            f"{r.fragmented_gpus:>11.0f}{r.failed_pods:>8}{r.admission_failures:>10}{r.denied_pods:>8}{r.runtime_s:>8.1f}s"
        )
    if paper and paper.summary:
        lines += ["", "FGD paper (USENIX ATC'23), same workload, mean of 10 seeds, own simulator:"]
        for policy in PAPER_POLICIES:
            row = paper.summary.get(policy)
            if row:
                lines.append(
                    f"  {policy[3:]:<18}{row['alloc_pct_at_arrive100'] / 100:>11.2%}"
                    f"{row['alloc_pct_at_arrive130'] / 100:>11.2%}{row['unallocated_gpus_at_130']:>13.0f}"
                )
    elif paper is None:
        lines += ["", "(FGD paper figures not found: pass --paper-dir)"]
    for r in results:
        for message, count in list(r.admission_reasons.items())[:2]:
            lines.append(f"{r.name}: {count} admission failure(s): {message}")
    lines += [
        "",
        (
            "alloc = sum of gpu_milli of placed pods / (GPUs x 1000) when that share of demand has arrived; "
            "fragmented = unallocated share on GPUs that hold a pod; admission = passed the scheduler, refused by kubelet."
        ),
    ]
    return "\n".join(lines)


def _plot(path: str, results: Sequence[replay.Result], paper: PaperFigures | None, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        raise SystemExit(
            "gpuslice-sim: --plot needs matplotlib; install the plot extra: pip install 'gpuslice[plot]'"
        ) from None
    figure, axes = pyplot.subplots(figsize=(8, 5))
    for r in results:
        axes.plot(range(len(r.allocation_curve)), [100 * v for v in r.allocation_curve], label=r.name, linewidth=2)
    if paper:
        for policy, curve in sorted(paper.curves.items()):
            axes.plot(range(len(curve)), [100 * v for v in curve], label=f"paper: {policy[3:]}", linestyle="--", linewidth=1)
    axes.set_xlabel("arrived GPU demand (% of cluster GPUs)")
    axes.set_ylabel("GPU allocation ratio (%)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)


# --- entry point -------------------------------------------------------------------------


def run(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, Any]:
    """Load the trace, replay every chosen configuration; returns the JSON document."""
    settings = config.from_args(args, environ)
    needs_dir = not (args.pods and args.nodes)
    trace_dir = trace.find_trace_dir(args.trace_dir, environ, REPO) if needs_dir else None
    nodes_file = pathlib.Path(args.nodes) if args.nodes else trace_dir / trace.DEFAULT_NODE_FILE  # type: ignore[operator]
    pods_file = pathlib.Path(args.pods) if args.pods else trace_dir / trace.DEFAULT_POD_FILE  # type: ignore[operator]
    nodes = trace.load_nodes(nodes_file)
    pods = trace.load_pods(pods_file)
    capacity = replay.gpu_capacity_milli(nodes)
    if capacity == 0:
        raise trace.TraceError(f"{nodes_file}: no GPU nodes")
    arrivals = replay.workload(pods, capacity, args.demand, np.random.default_rng(args.seed))
    delay = replay.LabelDelay(args.label_delay_binds, args.label_delay_seconds, args.pod_interval)
    chosen = replay.configurations(
        settings, percentage_of_nodes_to_score=args.percentage_of_nodes_to_score, binpack_strategy=args.binpack_strategy
    )
    results = [
        replay.replay(nodes, arrivals, chosen[name], seed=args.seed, label_delay=delay) for name in args.config_names
    ]
    paper_dir = pathlib.Path(args.paper_dir) if args.paper_dir else (nodes_file.parent.parent / "fgd-paper-results")
    paper = paper_figures(paper_dir, pods_file.stem, with_curves=bool(args.plot))
    meta = {
        "pods_file": pods_file.name,
        "nodes": len(nodes),
        "gpus": capacity // 1000,
        "arrivals": len(arrivals),
        "demand": args.demand,
        "seed": args.seed,
        "steering": settings.steering.enabled,
        "label_delay": {"binds": delay.binds, "seconds": delay.seconds, "pod_interval_seconds": delay.pod_interval_seconds},
    }
    document: dict[str, Any] = {**meta, "configurations": [r.to_json() for r in results]}
    if paper:
        document["paper"] = {p[3:]: paper.summary[p] for p in PAPER_POLICIES if p in paper.summary}
    document["_results"] = results
    document["_paper"] = paper
    return document


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        document = run(args, os.environ)
    except (trace.TraceError, config.ConfigError) as exc:
        print(f"gpuslice-sim: {exc}", file=sys.stderr)
        return 2
    results = document.pop("_results")
    paper = document.pop("_paper")
    if args.plot:
        _plot(args.plot, results, paper, f"{document['pods_file']}, seed {args.seed}")
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print(_text_report(results, paper, document))
        if args.plot:
            print(f"plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
