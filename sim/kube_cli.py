"""`gpuslice-sim --scheduler kube`: its flags, the runs they ask for, and the text report.

May import tqdm (a run's bar), gpuslice.config and the other gpuslice.sim modules.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import pathlib
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tqdm

from gpuslice import config
from gpuslice.sim import chaos as chaos_
from gpuslice.sim import controlplane, kube_arrivals, kube_outcomes, kube_replay, provenance, replay, trace
from gpuslice.sim import placements as placements_
from gpuslice.sim import progress as progress_


def parse_modes(text: str) -> tuple[str, ...]:
    """`device-plugin`, `dra`, or both comma-separated (each once)."""
    modes = tuple(m.strip() for m in text.split(","))
    unknown = [m for m in modes if m not in ("device-plugin", "dra")]
    if unknown or not modes or len(set(modes)) != len(modes):
        raise argparse.ArgumentTypeError(f"--mode {text!r}: give device-plugin, dra, or device-plugin,dra")
    return modes


def sample_nodes(nodes: Sequence[trace.TraceNode], count: int | None) -> list[trace.TraceNode]:
    """`count` of the nodes, evenly spaced through the list (so the GPU model mix stays); all without."""
    if count is None or count >= len(nodes):
        return list(nodes)
    if count < 1:
        raise ValueError(f"--node-sample must be at least 1, got {count}")
    picks = np.linspace(0, len(nodes) - 1, count).round().astype(int)
    return [nodes[i] for i in sorted(set(picks.tolist()))]


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def _seconds_up_to(most: float, *, zero: bool) -> Callable[[str], float]:
    """An argparse type: a number of seconds up to `most`, from 0 with `zero`, else above 0."""
    said = f"from 0 to {most:.0f}" if zero else f"above 0 and at most {most:.0f}"

    def seconds(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not ((0 <= value) if zero else (0 < value)) or not value <= most:  # NaN fails too
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds {said}")
        return value

    return seconds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("replay on the real control plane (--scheduler kube)")
    group.add_argument(
        "--scheduler",
        choices=("model", "kube"),
        default="model",
        help="model: the Python scheduler model (default); kube: the real kube-apiserver, kube-scheduler and webhook",
    )
    group.add_argument(
        "--arrival",
        default="burst",
        help="kube: sequential (one pod at a time), burst (all at once; default) or compressed:<factor> "
        "(the trace's inter-arrival gaps divided by factor)",
    )
    group.add_argument(
        "--mode",
        type=parse_modes,
        default=("device-plugin",),
        help="kube: how the gpuslice configurations offer GPUs: extended resources from the device plugin "
        "(device-plugin, the default), ResourceSlices and ResourceClaims (dra, docs/dra.md), or both side by "
        "side in one run (device-plugin,dra)",
    )
    group.add_argument(
        "--node-sample", type=int, metavar="N", help="kube: replay on N of the trace's nodes, evenly spaced"
    )
    group.add_argument(
        "--webhook-replicas",
        type=_positive_int,
        metavar="N",
        help="kube: N webhook processes behind a round-robin TCP proxy, as a Service spreads connections over a "
        "Deployment's pods (default: one webhook, no proxy)",
    )
    group.add_argument(
        "--chaos",
        type=chaos_.parse,
        action="append",
        default=[],
        metavar="ACTION@FRACTION",
        help=f"kube: kill a process with SIGKILL once FRACTION (0-1] of the arrivals have been created; ACTION is "
        f"{chaos_.KILL_WEBHOOK_REPLICA} (needs --webhook-replicas 2 or more), {chaos_.KILL_CONTROLLER_LEADER} "
        f"(a standby controller then runs beside the leader) or {chaos_.KILL_SCHEDULER} (started again, as kubelet "
        "would); may be given once for each",
    )
    group.add_argument(
        "--profile-scheduler",
        metavar="DIR",
        help="kube: write kube-scheduler's CPU profiles (pprof, 20 s each, the whole run) to "
        "DIR/<configuration>-<seed>/; read them with `go tool pprof -top DIR/<run>/*.pb.gz`",
    )
    group.add_argument(
        "--kubelet-prepare-seconds",
        type=_seconds_up_to(3600, zero=True),
        default=0.0,
        metavar="S",
        help="kube, DRA mode: kubelet prepares a bound pod's claims S seconds after the bind (its pod sync; "
        "default 0), and the node's steering labels, which count prepared claims, count them only then",
    )
    group.add_argument(
        "--settle-limit",
        type=_seconds_up_to(86400, zero=False),
        default=kube_replay.SETTLE_LIMIT_SECONDS,
        metavar="S",
        help="kube: after the last arrival, wait at most S seconds for every pod to be placed or found "
        f"unschedulable (default {kube_replay.SETTLE_LIMIT_SECONDS:.0f}); pods still waiting then count as "
        "having no outcome",
    )
    group.add_argument("--kube-bin", metavar="DIR", help=f"the built Kubernetes components [{controlplane.BIN_ENV}]")
    group.add_argument("--kube-workdir", metavar="DIR", help="keep the components' logs here (default: a temp dir)")


def main(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """`gpuslice-sim --scheduler kube`: prints the side-by-side report (or JSON); exit 2 on bad input."""
    try:
        arrival = kube_arrivals.parse_arrival(args.arrival)
        binaries = controlplane.find_binaries(args.kube_bin or environ.get(controlplane.BIN_ENV))
        if binaries is None:
            raise ValueError(
                f"--scheduler kube needs the built Kubernetes components ({', '.join(controlplane.BINARIES)}) "
                f"in --kube-bin or ${controlplane.BIN_ENV} (`make e2e` builds them)"
            )
        settings = config.from_args(args, environ)
        chaos_.check(
            args.chaos,
            webhook_replicas=args.webhook_replicas or 1,
            controller=settings.requeue.enabled or settings.pacing.enabled,
            dra="dra" in args.mode,
        )
        if args.kubelet_prepare_seconds and "dra" not in args.mode:
            raise ValueError("--kubelet-prepare-seconds is for DRA mode (--mode dra or device-plugin,dra)")
        nodes_file, pods_file = trace.trace_files(args.nodes, args.pods, args.trace_dir, environ, provenance.SOURCE)
        nodes = sample_nodes(trace.load_nodes(nodes_file), args.node_sample)
        pods = trace.load_pods(pods_file)
        gaps = kube_arrivals.trace_gaps(pods_file) if arrival.mode == "compressed" else [1.0]
        capacity = replay.gpu_capacity_milli(nodes)
        if capacity == 0:
            raise trace.TraceError(f"{nodes_file}: no GPU nodes")
        if args.placements:  # a path that cannot be written is said now, not after the replays
            try:
                pathlib.Path(args.placements).open("w", encoding="utf-8").close()
            except OSError as exc:
                raise ValueError(f"--placements {args.placements}: {exc.strerror or exc}") from None
    except (ValueError, config.ConfigError) as exc:  # TraceError is a ValueError
        print(f"gpuslice-sim: {exc}", file=sys.stderr)
        return 2
    commit = provenance.source_commit()  # now: the code the replays run, not what is there after them
    chosen = {}
    for mode in args.mode:
        enabled = dataclasses.replace(settings, dra=dataclasses.replace(settings.dra, enabled=mode == "dra"))
        if mode == "dra":  # nothing to pace: the scheduler allocates from ResourceSlices (docs/steering.md)
            enabled = dataclasses.replace(enabled, pacing=dataclasses.replace(enabled.pacing, enabled=False))
        configurations = replay.configurations(
            enabled,
            percentage_of_nodes_to_score=args.percentage_of_nodes_to_score,
            binpack_strategy=args.binpack_strategy,
        )
        for name, configuration in configurations.items():
            if name in args.config_names and (mode == "device-plugin" or configuration.sharing):
                key = f"{name}-dra" if mode == "dra" else name  # whole-gpu is the same in both modes
                chosen[key] = dataclasses.replace(configuration, name=key)
    runs = []
    for seed in range(args.seed, args.seed + args.seeds):
        arrivals = replay.workload(pods, capacity, args.demand, np.random.default_rng(seed))
        for name in chosen:
            workdir = pathlib.Path(args.kube_workdir or tempfile.mkdtemp(prefix="gpuslice-kube-"))
            try:
                with progress_.bar(len(arrivals), f"{name} seed {seed}") as shown:
                    result = kube_replay.replay_on_kube(
                        nodes,
                        arrivals,
                        chosen[name],
                        seed=seed,
                        arrival=arrival,
                        binaries=binaries,
                        workdir=workdir / f"{name}-{seed}",
                        gaps=gaps,
                        progress=functools.partial(_show_settled, shown),
                        placements=bool(args.placements),
                        webhook_replicas=args.webhook_replicas,
                        chaos=args.chaos,
                        profile_dir=(
                            pathlib.Path(args.profile_scheduler) / f"{name}-{seed}" if args.profile_scheduler else None
                        ),
                        prepare_seconds=args.kubelet_prepare_seconds,
                        settle_limit=args.settle_limit,
                    )
            finally:
                if not args.kube_workdir:
                    shutil.rmtree(workdir, ignore_errors=True)
            runs.append((seed, result))
    meta = {
        "pods_file": pods_file.name,
        "nodes": len(nodes),
        "gpus": capacity // 1000,
        "demand": args.demand,
        "arrival": str(arrival),
        "mode": ",".join(args.mode),
        "pacing": settings.pacing.enabled,  # device-plugin mode only (DRA has nothing to pace)
        "webhook_replicas": args.webhook_replicas or 1,
        "chaos": [str(e) for e in args.chaos],
        "commit": commit,
    }
    if args.placements:
        try:
            with pathlib.Path(args.placements).open("w", encoding="utf-8") as handle:
                placements_.write(handle, ((r.kube.name, s, pods_file.name, r.kube) for s, r in runs))
        except OSError as exc:
            print(f"gpuslice-sim: --placements {args.placements}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps({**meta, "runs": [{"seed": s, **r.to_json()} for s, r in runs]}, indent=2))
    else:
        print(text_report(meta, runs))
    return 0


def _show_settled(shown: tqdm.tqdm[Any], settled: int) -> None:
    shown.update(settled - shown.n)


def _chaos_line(kill: Mapping[str, Any]) -> str:
    """One --chaos kill as the text report says it."""
    if kill.get("killed") is None:
        return f"{kill['event']}: nothing of that kind in this run, nothing killed"
    line = f"{kill['event']}: killed {kill['killed']} {kill['at_s']:.1f} s in, after {kill['after_creates']} creates"
    if "standby_leading_after_s" in kill:
        took = kill["standby_leading_after_s"]
        line += "; no standby led by the end" if took is None else f"; the standby led {took:.1f} s later"
    return line


def _restart_line(restart: Mapping[str, Any]) -> str:
    """One kube-scheduler exit, and its start again, as the text report says it."""
    line = f"kube-scheduler exited (status {restart['status']}) {restart['at_s']:.1f} s in"
    ready = restart["ready_after_s"]
    return line + ("; not running again by the end" if ready is None else f"; running again {ready:.1f} s later")


def text_report(meta: Mapping[str, Any], runs: Sequence[tuple[int, kube_outcomes.KubeResult]]) -> str:
    lines = [
        f"gpuslice-sim --scheduler kube: {meta['pods_file']} on {meta['nodes']} nodes / {meta['gpus']} GPUs, "
        f"demand {meta['demand']:.0%}, arrival {meta['arrival']}, mode {meta.get('mode', 'device-plugin')}, "
        f"webhook replicas {meta.get('webhook_replicas', 1)}"
        + (f", Kubernetes {runs[0][1].kubernetes}" if runs else ""),
        "",
        f"{'configuration':<18}{'seed':>5} {'run':<6}{'pods':>7}{'alloc@100%':>11}{'alloc@end':>10}"
        f"{'placed':>8}{'unsched':>8}{'refused':>8}{'denied':>7}{'wall':>9}",
    ]
    for seed, run in runs:
        rows = [("kube", run.kube), ("model", run.model)]
        if run.model_paced is not None:
            rows.append(("paced", run.model_paced))
        for label, r in rows:
            lines.append(
                f"{r.name:<18}{seed:>5} {label:<6}{r.pods:>7}{r.at_demand(100):>11.2%}{r.gpu_allocation_ratio:>10.2%}"
                f"{r.placed_pods:>8}{r.failed_pods:>8}{r.admission_failures:>8}{r.denied_pods:>7}{r.runtime_s:>8.1f}s"
            )
        if len(run.paced_draws) > 1:
            lines.append(
                f"{'':<18}{'':>5} paced: the median of {len(run.paced_draws)} draws of the conversion order, "
                f"{min(run.paced_draws):.2%} to {max(run.paced_draws):.2%}"
            )
        lines.append(
            f"{'':<18}{'':>5} kube - model: {run.difference_points:+.2f} points; set-up {run.setup_s:.0f} s, "
            f"creates done after {run.arrivals_s:.1f} s, "
            f"{run.label_writes} label writes, {run.lost_pods} pods lost"
        )
        attempts = run.diagnosis.get("attempts")
        if attempts:
            since = " since its last start" if run.scheduler_restarts else ""
            lines.append(
                f"{'':<18}{'':>5} scheduler: {sum(attempts.values())} attempts{since} "
                f"({', '.join(f'{n} {result}' for result, n in attempts.items())})"
            )
        for restart in run.scheduler_restarts:
            lines.append(f"{'':<24}{_restart_line(restart)}")
        for reason, count in run.kube.admission_reasons.items():
            lines.append(f"{'':<24}lost x{count}: {reason}")
        for kill in run.chaos:
            lines.append(f"{'':<24}chaos: {_chaos_line(kill)}")
        if run.create_retries:
            lines.append(f"{'':<24}{run.create_retries} creates sent again after a failed webhook call")
        if run.unaccounted:
            lines.append(f"{'':<24}UNACCOUNTED: {len(run.unaccounted)} pods, e.g. {run.unaccounted[:3]}")
        for error in run.errors[:5]:
            lines.append(f"{'':<24}error: {error}")
    lines += [
        "",
        "unsched = the scheduler found no node (PodScheduled False); refused = refusals by a node's kubelet "
        "(UnexpectedAdmissionError; the controller's requeuer recreates a refused pod, which counts by what became "
        "of it, and a pod refused at its last attempt is lost); wall = first create to last outcome (model: its "
        "run time);",
        "model = labels seen at once; paced = the model with each node's labels written at most once per "
        "steering.labelMinIntervalSeconds, each pod converted and scheduled at the moments the kube run",
        "showed (its create answered; its first binding or unschedulable mark), converted in the order the API "
        "server stored the pods and scheduled in the order they were decided; with pods created ahead of the "
        f"scheduler, the median of {kube_replay.PACED_DRAWS} draws of the conversion order within what the run "
        "cannot tell apart.",
    ]
    return "\n".join(lines)
