"""`gpuslice-mps-control-daemon`: runs NVIDIA's MPS control daemon for the chart's DaemonSet.

    gpuslice-mps-control-daemon --pipe-directory DIR --log-directory DIR [--shm-directory DIR]
                                [--control PATH] [--check]

It prepares what MPS clients in other pods need, then runs `nvidia-cuda-mps-control -f` (in the
foreground, so the container lives as long as the daemon) with CUDA_MPS_PIPE_DIRECTORY and
CUDA_MPS_LOG_DIRECTORY set:

* the pipe and log directories exist;
* the shared /dev/shm (a host directory both the daemon and every client pod mount there, see
  node/response.py) is mode 1777 like any /dev/shm, so clients running as any user can
  create their segments in it;
* SIGTERM/SIGINT send the daemon `quit` through its control pipe (`echo quit |
  nvidia-cuda-mps-control`, NVIDIA's documented way to stop it), then wait for it to exit.

`--check` asks the running daemon `get_default_active_thread_percentage` and exits 0 if it answers
(the DaemonSet's readiness probe; NVIDIA's own MPS daemon uses the same query as health).
The NVIDIA container runtime puts the control binary in the container (compute capability).
The daemon is one runnable under gpuslice/runtime.py's supervisor (signals, a bounded stop); the
process ends when the daemon does, with its status.

Imports gpuslice.runtime alone.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Sequence

from gpuslice import runtime

__all__ = ["main"]

_STOP_SECONDS = 20.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuslice-mps-control-daemon", description=__doc__.split("\n")[0])
    parser.add_argument("--pipe-directory", required=True, help="CUDA_MPS_PIPE_DIRECTORY (shared with client pods)")
    parser.add_argument("--log-directory", required=True, help="CUDA_MPS_LOG_DIRECTORY")
    parser.add_argument("--shm-directory", default="/dev/shm", help="the /dev/shm shared with client pods")
    parser.add_argument("--control", default="nvidia-cuda-mps-control", help="the MPS control binary")
    parser.add_argument("--check", action="store_true", help="exit 0 if the running daemon answers")
    return parser


def _environment(args: argparse.Namespace) -> dict[str, str]:
    return {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": args.pipe_directory, "CUDA_MPS_LOG_DIRECTORY": args.log_directory}


def _ask(args: argparse.Namespace, command: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [args.control], input=command + "\n", env=_environment(args), capture_output=True, text=True, timeout=timeout
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.check:
        try:
            answer = _ask(args, "get_default_active_thread_percentage", timeout=5)
        except (OSError, subprocess.TimeoutExpired) as exc:
            print(f"gpuslice-mps-control-daemon: the MPS control daemon does not answer: {exc}", file=sys.stderr)
            return 1
        return 0 if answer.returncode == 0 and answer.stdout.strip() else 1
    try:
        for directory in (args.pipe_directory, args.log_directory):
            os.makedirs(directory, exist_ok=True)
        os.chmod(args.shm_directory, 0o1777)
    except OSError as exc:  # a path that is a file, a read-only mount, a missing /dev/shm mount
        print(f"gpuslice-mps-control-daemon: cannot prepare the shared directories: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_supervise(args))
    except OSError as exc:
        print(f"gpuslice-mps-control-daemon: cannot start {args.control}: {exc}", file=sys.stderr)
        return 1


async def _supervise(args: argparse.Namespace) -> int:
    """Run the daemon until it exits or SIGTERM/SIGINT asks it to quit; its exit status."""
    stop = asyncio.Event()
    daemon: asyncio.subprocess.Process | None = None

    async def start() -> None:
        nonlocal daemon
        daemon = await asyncio.create_subprocess_exec(args.control, "-f", env=_environment(args))

    async def run() -> None:
        assert daemon is not None
        await daemon.wait()
        stop.set()  # the daemon is the process: it ends with it

    async def quit_daemon() -> None:
        if daemon is None or daemon.returncode is not None:
            return
        try:
            await asyncio.to_thread(_ask, args, "quit", _STOP_SECONDS)
        except (OSError, subprocess.TimeoutExpired):
            daemon.terminate()
        await daemon.wait()

    part = runtime.Component("mps-control-daemon", start=start, run=run, stop=quit_daemon)
    # Its stop asks, then waits as long again for the daemon to go.
    await runtime.Supervisor([part], stop=stop, grace=2 * _STOP_SECONDS).run()
    returncode = daemon.returncode if daemon is not None else None
    if returncode is None:  # it did not go within the grace (logged): the container's end stops it
        return 1
    return 0 if returncode in (0, -signal.SIGTERM) else returncode


if __name__ == "__main__":
    sys.exit(main())
