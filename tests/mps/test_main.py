"""`gpuslice-mps-control-daemon` with a stand-in for nvidia-cuda-mps-control (a script that records
what it was given): directories prepared, /dev/shm opened to every user, the daemon run in the
foreground with the pipe and log directories, `--check` answered, SIGTERM turned into `quit`."""

from __future__ import annotations

import os
import pathlib
import signal
import stat
import subprocess
import sys
import textwrap
import time

FAKE_CONTROL = textwrap.dedent(
    """\
    #!{python}
    import os, pathlib, sys, time
    record = pathlib.Path({record!r})
    if sys.argv[1:] == ["-f"]:
        directories = [os.environ["CUDA_MPS_PIPE_DIRECTORY"], os.environ["CUDA_MPS_LOG_DIRECTORY"]]
        (record / "daemon").write_text("\\n".join(directories))
        while not (record / "quit").exists():
            time.sleep(0.02)
        sys.exit(0)
    command = sys.stdin.read().strip()
    if command == "quit":
        (record / "quit").write_text("quit")
    elif command == "get_default_active_thread_percentage":
        if not (record / "daemon").exists():
            sys.exit(1)
        print("100.0")
    """
)


def fake_control(tmp_path: pathlib.Path) -> pathlib.Path:
    record = tmp_path / "record"
    record.mkdir()
    control = tmp_path / "nvidia-cuda-mps-control"
    control.write_text(FAKE_CONTROL.format(python=sys.executable, record=str(record)))
    control.chmod(0o755)
    return control


def wait_for(path: pathlib.Path, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not path.exists():
        assert time.monotonic() < deadline, f"never appeared: {path}"
        time.sleep(0.02)


def test_the_daemon_runs_with_shared_directories_answers_checks_and_quits_on_sigterm(tmp_path):
    control = fake_control(tmp_path)
    shm = tmp_path / "shm"
    shm.mkdir(mode=0o755)
    args = [
        f"--pipe-directory={tmp_path / 'pipe'}",
        f"--log-directory={tmp_path / 'log'}",
        f"--shm-directory={shm}",
        f"--control={control}",
    ]
    command = [sys.executable, "-m", "gpuslice.mps.main", *args]
    check = subprocess.run([*command, "--check"], capture_output=True, text=True, timeout=30)
    assert check.returncode == 1  # no daemon yet
    daemon = subprocess.Popen(command)
    try:
        wait_for(tmp_path / "record" / "daemon")
        directories = (tmp_path / "record" / "daemon").read_text().split("\n")
        assert directories == [str(tmp_path / "pipe"), str(tmp_path / "log")]
        assert (tmp_path / "pipe").is_dir() and (tmp_path / "log").is_dir()
        assert stat.S_IMODE(os.stat(shm).st_mode) == 0o1777  # every client user may create segments
        assert subprocess.run([*command, "--check"], timeout=30).returncode == 0
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=30) == 0
        assert (tmp_path / "record" / "quit").read_text() == "quit"
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


def test_a_missing_control_binary_is_named_and_fails(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuslice.mps.main",
            f"--pipe-directory={tmp_path / 'p'}",
            f"--log-directory={tmp_path / 'l'}",
            f"--shm-directory={shm}",
            f"--control={tmp_path / 'absent'}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1 and "cannot start" in result.stderr and "absent" in result.stderr


def test_a_shared_directory_that_cannot_be_made_is_one_line_and_exit_2(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuslice.mps.main",
            f"--pipe-directory={blocker / 'pipe'}",
            f"--log-directory={tmp_path / 'l'}",
            f"--shm-directory={tmp_path}",
            f"--control={tmp_path / 'absent'}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "cannot prepare the shared directories" in result.stderr
