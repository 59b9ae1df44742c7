"""Where a replay's CPU and GPUs went, by node model: `python -m gpuslice.sim.bymodel FILE
[--trace-dir T]`, FILE written by `gpuslice-sim --placements`.

Per replay and per kind of node (GPU model and count, as the trace lists them): the CPU the pods
placed there ask for, the GPU memory granted there, the GPUs no pod holds, and the pods placed by
kind (asking no GPU, a share, whole GPUs). Two modes' lines side by side say where one left GPUs
the other used, and whose CPU stranded them (docs/benchmarks.md, "DRA mode and device-plugin
mode"). The pods' CPU comes from the trace's pod file the run line names (copies of a pod at
demand above 100 % are named `<pod>-r<k>`).

May import gpuslice.sim.{placements,trace}.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import pathlib
import re
import sys
from collections.abc import Iterable, Mapping, Sequence

from gpuslice.sim import placements, trace

__all__ = ["Row", "breakdown", "main"]

_COPY = re.compile(r"-r\d+$")  # the suffix of a pod's copy (sim/replay.py)


@dataclasses.dataclass
class Row:
    """One kind of node in one replay."""

    kind: str  # "<model>/<GPUs per node>"
    gpus: int = 0
    cpu_milli: int = 0  # the nodes' CPU
    cpu_asked_milli: int = 0  # by the pods placed on them
    granted_gpus: float = 0.0
    idle_gpus: int = 0  # no pod holds any of them
    pods: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)  # cpu, share, whole


def _pod_kind(num_gpu: int, gpu_milli: int) -> str:
    if num_gpu == 0:
        return "cpu"
    return "share" if gpu_milli < 1000 else "whole"


def breakdown(
    lines: Iterable[str], nodes: Sequence[trace.TraceNode], pods: Mapping[str, trace.TracePod]
) -> dict[tuple[str, int], list[Row]]:
    """Per (configuration, seed): a Row per kind of GPU node, by name. PlacementsError for a line
    that is not a placements line or a pod the pod file lacks."""
    by_name = {n.name: n for n in nodes if n.gpus}
    out: dict[tuple[str, int], dict[str, Row]] = {}
    # Per replay: (node, GPU) -> the share of its memory granted (capped at 1 once summed, as
    # placements.recompute does).
    shares: dict[tuple[str, int], dict[tuple[str, str], float]] = {}
    for number, key, line in placements.records(lines):  # a run's line comes before its pods'
        if line["record"] == "run":
            rows = out[key] = {}
            shares[key] = collections.defaultdict(float)
            for node in by_name.values():
                row = rows.setdefault(f"{node.model}/{node.gpus}", Row(f"{node.model}/{node.gpus}"))
                row.gpus += node.gpus
                row.cpu_milli += node.cpu_milli
            continue
        rows, granted = out[key], shares[key]
        where = by_name.get(line.get("node") or "")
        if line["outcome"] != "placed" or where is None:
            continue
        pod = pods.get(_COPY.sub("", line["pod"]))
        if pod is None:
            raise placements.PlacementsError(f"line {number}: pod {line['pod']} is not in the pod file")
        row = rows[f"{where.model}/{where.gpus}"]
        row.cpu_asked_milli += pod.cpu_milli
        row.pods[_pod_kind(line["num_gpu"], line["gpu_milli"])] += 1
        for gpu in line["gpus"]:
            granted[(where.name, gpu["uuid"])] += gpu["units"] * gpu["unit_mib"] / gpu["gpu_memory_mib"]
    for key, rows in out.items():
        held: collections.Counter[str] = collections.Counter()
        for (name, _), share in shares[key].items():
            rows[f"{by_name[name].model}/{by_name[name].gpus}"].granted_gpus += min(1.0, share)
            held[name] += 1
        for node in by_name.values():
            rows[f"{node.model}/{node.gpus}"].idle_gpus += node.gpus - held[node.name]
    return {key: sorted(rows.values(), key=lambda r: r.kind) for key, rows in out.items()}


def _pods_file(path: pathlib.Path) -> str:
    """The pod file named by the first run line of a placements file."""
    with path.open(encoding="utf-8") as handle:
        for _, _, line in placements.records(handle):
            return str(line["pods_file"])
    raise placements.PlacementsError("no run line")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpuslice.sim.bymodel",
        description="Where a replay's CPU and GPUs went, by node model, from a gpuslice-sim --placements file.",
    )
    parser.add_argument("file", help="the file written by gpuslice-sim --placements")
    parser.add_argument("--trace-dir", help="the trace the replay ran on (default: as gpuslice-sim finds it)")
    args = parser.parse_args(argv)
    path = pathlib.Path(args.file)
    try:
        folder = trace.find_trace_dir(args.trace_dir, os.environ, pathlib.Path(__file__).resolve().parents[1])
        nodes = trace.load_nodes(folder / trace.DEFAULT_NODE_FILE)
        pods = {p.name: p for p in trace.load_pods(folder / _pods_file(path))}
        with path.open(encoding="utf-8") as handle:
            result = breakdown(handle, nodes, pods)
    except (OSError, placements.PlacementsError, trace.TraceError) as exc:
        print(f"bymodel: {exc}", file=sys.stderr)
        return 2
    for (configuration, seed), rows in result.items():
        print(f"{configuration}, seed {seed}")
        print(
            f"  {'nodes':<14}{'GPUs':>6}{'CPU asked':>11}{'granted':>9}{'idle':>6}"
            f"{'CPU pods':>10}{'shares':>8}{'whole':>7}"
        )
        for r in rows:
            print(
                f"  {r.kind:<14}{r.gpus:>6}{r.cpu_asked_milli / r.cpu_milli:>11.1%}{r.granted_gpus / r.gpus:>9.1%}"
                f"{r.idle_gpus:>6}{r.pods['cpu']:>10}{r.pods['share']:>8}{r.pods['whole']:>7}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
