"""How fast the device plugin notices a kubelet restart, and what watching costs while idle:
the directory watch (watchfiles/inotify) against polling every 0.5 s (what the manager did before
it watched, and does now when no watch can be set up), measured side by side.

The demo node's four resources with the kubelet emulator (sim/kubelet.py) in a temporary directory:
each restart deletes the plugin sockets and re-creates kubelet.sock; the time is from the restart's
end (kubelet.sock back and serving) to every resource registered again. Idle CPU is the process's
CPU time (all threads: the watch runs in one) over a quiet stretch with every plugin registered.

    .venv/bin/python benchmarks/bench_kubelet_restart.py [--restarts 20] [--idle-seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import pathlib
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from gpuslice import config
from gpuslice.deviceplugin import manager
from gpuslice.node import health, metrics, nodefile
from gpuslice.sim import kubelet as sim_kubelet

NODE = pathlib.Path(__file__).resolve().parent.parent / "gpuslice" / "examples" / "demo-node.yaml"


@contextlib.contextmanager
def polling_only() -> Iterator[None]:
    """The manager as if no watch could be set up: it polls every FALLBACK_POLL_SECONDS."""

    async def no_watch(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise OSError("watch turned off for the comparison")
        yield

    real = manager.watchfiles.awatch
    manager.watchfiles.awatch = no_watch  # type: ignore[assignment]
    try:
        yield
    finally:
        manager.watchfiles.awatch = real


async def measure(directory: pathlib.Path, restarts: int, idle_seconds: float) -> tuple[list[float], float]:
    node = nodefile.load(NODE)
    async with sim_kubelet.Kubelet(directory) as kubelet:
        plugins = manager.PluginManager(
            manager.build_resources(node, config.Config()),
            kubelet_dir=directory,
            health_state=health.HealthState(),
            plugin_metrics=metrics.Metrics(),
            poll_interval=3600,  # no safety-net pass during the run: only the watch or the polling
        )
        await plugins.start()
        try:
            expected = len(plugins.servers)
            await kubelet.wait_until(lambda: len(kubelet.registrations) == expected)
            latencies = []
            for n in range(2, restarts + 2):
                await kubelet.restart()
                started = time.perf_counter()
                await kubelet.wait_until(lambda n=n: len(kubelet.registrations) == n * expected)
                latencies.append((time.perf_counter() - started) * 1000)
            cpu = time.process_time()
            await asyncio.sleep(idle_seconds)
            idle = (time.process_time() - cpu) / idle_seconds * 1000  # ms of CPU per second
        finally:
            await plugins.stop()
    return latencies, idle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--restarts", type=int, default=20)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    args = parser.parse_args()
    print(f"{args.restarts} kubelet restarts, then {args.idle_seconds:.0f} s idle, per mode")
    for mode in ("watch", "poll 0.5 s"):
        with tempfile.TemporaryDirectory(prefix="gs-bench-kubelet-") as root:
            with polling_only() if mode != "watch" else contextlib.nullcontext():
                latencies, idle = asyncio.run(measure(pathlib.Path(root), args.restarts, args.idle_seconds))
        print(
            f"  {mode:11s} re-registered after: median {statistics.median(latencies):6.1f} ms, "
            f"max {max(latencies):6.1f} ms;  idle CPU {idle:.2f} ms/s"
        )


if __name__ == "__main__":
    main()
