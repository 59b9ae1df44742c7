#!/usr/bin/env python3
"""`make gpu-check`: gpuslice's node code on a real NVIDIA GPU, in under five minutes, changing no
GPU setting (no compute mode, MIG, clock or persistence change; it only allocates memory in child
processes and starts an MPS control daemon in a private pipe directory, which it stops again).

    python3 tools/gpu-check.py [--report FILE] [--allocate-mib N] [--mps-limit-mib N]

Stages, each printed as PASS, FAIL or SKIP with what it measured:

1. nvml     NVML discovery as the device plugin runs it (nvml_source.discover), the units each
            GPU would advertise, and raw answers of the NVML calls our fake and mock stand in for
            (their types, error classes and struct fields), so they can be checked against these.
2. monitor  a child process allocates a known amount of GPU memory through the CUDA driver API
            (libcuda with ctypes: no toolkit or framework), sits in a cgroup laid out as
            kubelet's cgroupfs driver lays out a container's, and the real usage monitor
            (UsageMonitor.sample_once: NVML, /proc, the cgroup, a PodResources record, the join,
            over-use detection and the warn policy's Event) finds it, names its pod and flags it.
3. mps      gpuslice-mps-control-daemon starts NVIDIA's control daemon in a private pipe
            directory; client A (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=<limit>) allocates in 128 MiB
            steps until CUDA refuses, client B of the same server keeps allocating; the
            allocation past the limit must fail in A only. The monitor's reader lists both.

Run it on a machine with the NVIDIA driver: with the repository's own .venv where there is one
(`make venv proto`), else with any Python 3.11+ that has gpuslice's dependencies (nvidia-ml-py,
PyYAML, prometheus-client, grpcio, protobuf) and the generated gRPC stubs. Exit status 0 when every
stage passed, 1 when one failed, 2 when there is no GPU or driver to check.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import dataclasses
import json
import os
import pathlib
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid as uuid_
from collections.abc import Iterator
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_MIB = 1 << 20
_CHILD_TIMEOUT = 60.0
_STEP_MIB = 128


# --- the CUDA child: allocates on command, through the driver API ------------------------------------------


def child_main() -> int:
    """Reads `alloc MIB`, `free`, `quit` from stdin; answers one line each (`ok TOTAL_MIB` or
    `fail CUDA_ERROR_NAME TOTAL_MIB`). Holds a primary context on device 0 of CUDA_VISIBLE_DEVICES."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        print(f"error libcuda.so.1 not loadable: {exc}", flush=True)
        return 1

    def name(code: int) -> str:
        text = ctypes.c_char_p()
        cuda.cuGetErrorName(code, ctypes.byref(text))
        return (text.value or b"CUDA_ERROR_%d" % code).decode()

    device, context = ctypes.c_int(), ctypes.c_void_p()
    for call, args in (
        ("cuInit", (0,)),
        ("cuDeviceGet", (ctypes.byref(device), 0)),
        ("cuDevicePrimaryCtxRetain", (ctypes.byref(context), device)),
        ("cuCtxSetCurrent", (context,)),
    ):
        code = getattr(cuda, call)(*args)
        if code != 0:
            print(f"error {call}: {name(code)}", flush=True)
            return 1
    held: list[ctypes.c_uint64] = []
    sizes: list[int] = []
    print(f"ready {os.getpid()}", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        if words[0] == "alloc":
            pointer = ctypes.c_uint64()
            code = cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(int(words[1]) * _MIB))
            if code == 0:
                held.append(pointer)
                sizes.append(int(words[1]))
                print(f"ok {sum(sizes)}", flush=True)
            else:
                print(f"fail {name(code)} {sum(sizes)}", flush=True)
        elif words[0] == "free":
            for pointer in held:
                cuda.cuMemFree_v2(pointer)
            held.clear()
            sizes.clear()
            print("ok 0", flush=True)
    return 0


class CudaChild:
    """A child process running `child_main`, driven line by line."""

    def __init__(self, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(pathlib.Path(__file__).resolve()), "--child"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        first = self._line()
        if not first.startswith("ready"):
            self.close()
            raise CheckFailed(f"the CUDA child did not start: {first}")
        self.pid = self.process.pid

    def _line(self) -> str:
        assert self.process.stdout is not None
        deadline = time.monotonic() + _CHILD_TIMEOUT
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if selector.select(timeout=1.0):
                    line = self.process.stdout.readline()
                    return line.strip() or f"(the child exited: {self.process.poll()})"
        raise CheckFailed(f"the CUDA child did not answer within {_CHILD_TIMEOUT:.0f} s")

    def ask(self, command: str) -> tuple[bool, str, int]:
        """(succeeded, error name or "", MiB held after the command)."""
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        words = self._line().split()
        if words[:1] == ["ok"]:
            return True, "", int(words[1])
        if words[:1] == ["fail"]:
            return False, words[1], int(words[2])
        raise CheckFailed(f"the CUDA child answered {' '.join(words)!r} to {command!r}")

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.process.stdin is not None
            self.process.stdin.write("quit\n")
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# --- results ----------------------------------------------------------------------------------------------


class CheckFailed(Exception):
    """A stage's expectation did not hold; the message says what was seen."""


class CheckSkipped(Exception):
    """A stage cannot run here; the message says why."""


@dataclasses.dataclass
class Stage:
    name: str
    result: str = "PASS"
    seconds: float = 0.0
    lines: list[str] = dataclasses.field(default_factory=list)
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)

    def say(self, text: str) -> None:
        self.lines.append(text)
        print(f"  {text}", flush=True)


@contextlib.contextmanager
def stage(name: str, stages: list[Stage]) -> Iterator[Stage]:
    current = Stage(name)
    stages.append(current)
    print(f"[{name}]", flush=True)
    started = time.monotonic()
    try:
        yield current
    except CheckSkipped as exc:
        current.result = "SKIP"
        current.say(f"skipped: {exc}")
    except CheckFailed as exc:
        current.result = "FAIL"
        current.say(f"failed: {exc}")
    except Exception as exc:  # noqa: BLE001 - a surprise in one stage is that stage's failure
        current.result = "FAIL"
        current.say(f"failed: {type(exc).__name__}: {exc}")
    current.seconds = time.monotonic() - started
    print(f"{current.result} {name} ({current.seconds:.1f} s)", flush=True)


# --- 1. NVML -----------------------------------------------------------------------------------------------


def _answer(call: Any, *args: Any) -> Any:
    """A raw NVML answer for the report: its value and type, or the error class it raised."""
    try:
        value = call(*args)
    except Exception as exc:  # noqa: BLE001 - the class is the fact being recorded
        return {"raises": type(exc).__name__}
    if isinstance(value, (bytes, str, int, float)) or value is None:
        return {"type": type(value).__name__, "value": value.decode() if isinstance(value, bytes) else value}
    if isinstance(value, (list, tuple)):
        return {"type": type(value).__name__, "value": [_fields(v) for v in value]}
    return {"type": type(value).__name__, "value": _fields(value)}


def _fields(value: Any) -> Any:
    fields = getattr(value, "_fields_", None)
    if not fields:
        return value if isinstance(value, (int, float, str)) else repr(value)
    out = {}
    for field in fields:
        item = getattr(value, field[0])
        out[field[0]] = item.decode(errors="replace") if isinstance(item, bytes) else _fields(item)
    return out


def check_nvml(current: Stage) -> tuple[Any, Any]:
    from gpuslice.node import nvml_source

    try:
        nvml = nvml_source.load_pynvml()
    except nvml_source.NvmlUnavailable as exc:
        raise CheckSkipped(f"no NVIDIA driver or GPU: {exc}") from None
    except ImportError as exc:
        raise CheckSkipped(f"nvidia-ml-py is not installed: {exc}") from None
    from gpuslice import contract

    unit_mib = contract.Contract().unit_mib
    current.facts["driver"] = _answer(nvml.nvmlSystemGetDriverVersion)
    current.facts["cuda_driver"] = _answer(nvml.nvmlSystemGetCudaDriverVersion)
    current.facts["nvml_py"] = getattr(nvml, "__version__", "?")
    current.say(
        f"driver {current.facts['driver'].get('value')}, CUDA {current.facts['cuda_driver'].get('value')}, "
        f"nvidia-ml-py {current.facts['nvml_py']}"
    )
    started = time.perf_counter()
    node = nvml_source.discover(nvml)
    current.say(f"discovery took {(time.perf_counter() - started) * 1000:.1f} ms")
    if not node.gpus:
        raise CheckFailed("NVML answered but lists no GPU")
    for gpu in node.gpus:
        migs = ", ".join(f"{m.profile} {m.memory_mib} MiB" for m in gpu.mig) or "none"
        current.say(
            f"GPU {gpu.index}: {gpu.model}, {gpu.memory_mib} MiB -> {gpu.memory_mib // unit_mib} units of "
            f"{unit_mib} MiB, {gpu.uuid}, PCI {gpu.pci_bus_id}, NUMA {gpu.numa_node}, minor {gpu.minor_number}, "
            f"MIG {'on' if gpu.mig_enabled else 'off'} (devices: {migs}), NVLink peers {len(gpu.nvlinks)}"
        )
    handles = nvml_source.device_handles(nvml)  # by index: what the monitor and health fall back on
    expected = {g.uuid for g in node.gpus} | {m.uuid for g in node.gpus for m in g.mig}
    if set(handles) != expected:
        raise CheckFailed(f"device_handles found {sorted(handles)}, discovery {sorted(expected)}")
    current.say(f"device handles by index: {len(handles)}, the same devices as discovery")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    raw: dict[str, Any] = {}
    for call, args in (
        ("nvmlDeviceGetUUID", (handle,)),
        ("nvmlDeviceGetName", (handle,)),
        ("nvmlDeviceGetPciInfo", (handle,)),
        ("nvmlDeviceGetMemoryInfo", (handle,)),
        ("nvmlDeviceGetMinorNumber", (handle,)),
        ("nvmlDeviceGetNumaNodeId", (handle,)),
        ("nvmlDeviceGetMigMode", (handle,)),
        ("nvmlDeviceGetMaxMigDeviceCount", (handle,)),
        ("nvmlDeviceGetMigDeviceHandleByIndex", (handle, 0)),
        ("nvmlDeviceGetUtilizationRates", (handle,)),
        ("nvmlDeviceGetComputeRunningProcesses", (handle,)),
        ("nvmlDeviceGetGraphicsRunningProcesses", (handle,)),
        ("nvmlDeviceGetMPSComputeRunningProcesses", (handle,)),
        ("nvmlDeviceGetProcessUtilization", (handle, int((time.time() - 20) * 1e6))),
        ("nvmlDeviceGetNvLinkState", (handle, 0)),
        ("nvmlDeviceGetSupportedEventTypes", (handle,)),
        ("nvmlDeviceGetComputeMode", (handle,)),
        ("nvmlDeviceGetHandleByUUID", ("GPU-00000000-0000-0000-0000-000000000000",)),
        ("nvmlDeviceGetGpuInstanceProfileInfo", (handle, 0)),
    ):
        function = getattr(nvml, call, None)
        raw[call] = _answer(function, *args) if function is not None else {"missing": "not in this nvidia-ml-py"}
    raw["NVML_NVLINK_MAX_LINKS"] = nvml.NVML_NVLINK_MAX_LINKS
    raw["NVML_VALUE_NOT_AVAILABLE"] = getattr(nvml, "NVML_VALUE_NOT_AVAILABLE", None)
    event_set = nvml.nvmlEventSetCreate()
    try:
        raw["nvmlDeviceRegisterEvents(xid)"] = _answer(
            nvml.nvmlDeviceRegisterEvents, handle, nvml.nvmlEventTypeXidCriticalError, event_set
        )
        raw["nvmlEventSetWait(100 ms)"] = _answer(nvml.nvmlEventSetWait, event_set, 100)
    finally:
        nvml.nvmlEventSetFree(event_set)
    current.facts["raw"] = raw
    for call, answer in raw.items():
        current.say(f"raw {call}: {json.dumps(answer, default=str)[:300]}")
    return nvml, node


# --- 2. the usage monitor ----------------------------------------------------------------------------------


@contextlib.contextmanager
def kubepods_cgroup(pod_uid: str, container_id: str) -> Iterator[pathlib.Path | None]:
    """A cgroup laid out as kubelet's cgroupfs driver lays out a Burstable container's
    (.../kubepods/burstable/pod<uid>/<container id>), under this process's own cgroup of one
    hierarchy (cgroup v2, else v1 `pids`). Yields its directory (None where none can be made);
    removed afterwards, its processes moved back first."""
    base = _own_cgroup_dir()
    if base is None:
        yield None
        return
    top = base / f"gpuslice-gpu-check-{os.getpid()}"
    leaf = top / "kubepods" / "burstable" / f"pod{pod_uid}" / container_id
    try:
        leaf.mkdir(parents=True)
    except OSError:
        yield None
        return
    try:
        yield leaf
    finally:
        with contextlib.suppress(OSError):
            for pid in (leaf / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (base / "cgroup.procs").write_text(pid)
        for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [top]:
            with contextlib.suppress(OSError):
                directory.rmdir()


def _own_cgroup_dir() -> pathlib.Path | None:
    mounts = {}
    for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype, _, options = right.split(" ", 2) if right.count(" ") >= 2 else (right, "", "")
        if fstype == "cgroup2":
            mounts.setdefault("", left.split()[4])
        elif fstype == "cgroup" and "pids" in options.split(","):
            mounts.setdefault("pids", left.split()[4])
    for entry in pathlib.Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = entry.split(":", 2)
        key = "" if controllers == "" else ("pids" if "pids" in controllers.split(",") else None)
        if key in mounts:
            candidate = pathlib.Path(mounts[key]) / path.lstrip("/")
            if os.access(candidate, os.W_OK):
                return candidate
    return None


class _Holdings:
    """Stands in for kubelet's PodResources client: the grant of the pod this check makes up."""

    def __init__(self, entries: list[Any]) -> None:
        self._entries = entries

    async def container_devices(self, wanted: Any) -> list[Any]:
        return [e for e in self._entries if wanted(e.resource)]


class _Pods:
    """Stands in for the API server's pod list and Events (the monitor's PodApi)."""

    def __init__(self, pods: list[Any]) -> None:
        self.pods = pods
        self.events: list[Any] = []

    async def node_pods(self, node_name: str) -> list[Any]:
        return self.pods

    async def create_event(self, event: Any, node_name: str) -> None:
        self.events.append(event)

    async def evict(self, namespace: str, name: str, uid: str) -> Any:
        raise AssertionError("the check runs the warn policy")


def check_monitor(current: Stage, nvml: Any, node: Any, allocate_mib: int) -> None:
    from gpuslice import config, contract
    from gpuslice.deviceplugin import gpu_usage, monitor, podapi
    from gpuslice.node import podresources

    shared = gpu_usage.shared_devices(node)
    if not shared:
        raise CheckSkipped("every GPU here is in MIG mode without MIG devices")
    device, gpu = shared[0]
    pod_uid, container_id = str(uuid_.uuid4()), os.urandom(32).hex()
    names = contract.Contract()
    granted_units = max(1, allocate_mib // 2 // names.unit_mib)  # half what it will use: an over-use
    with kubepods_cgroup(pod_uid, container_id) as leaf:
        child = CudaChild({**os.environ, "CUDA_VISIBLE_DEVICES": device})
        try:
            if leaf is not None:
                (leaf / "cgroup.procs").write_text(str(child.pid))
                current.say(f"child {child.pid} placed in {leaf}")
            else:
                current.say("no writable cgroup hierarchy: the child stays outside kubepods (attribution skipped)")
            ok, error, held = child.ask(f"alloc {allocate_mib}")
            if not ok:
                raise CheckFailed(f"cuMemAlloc of {allocate_mib} MiB failed: {error}")
            settings = config.load(
                environ={},
                overrides={
                    "monitor.overuseSeconds": 1,
                    "monitor.overuseToleranceMiB": 0,
                    "monitor.overusePolicy": "warn",
                },
            )
            units = tuple(names.unit_device_id(gpu, i) for i in range(granted_units))
            holdings = _Holdings(
                [podresources.ContainerDevices("gpu-check", "pod", "main", names.gpu_memory_resource, units)]
            )
            pods = _Pods([podapi.PodInfo(pod_uid, "gpu-check", "pod", {container_id: "main"})])
            usage = monitor.UsageMonitor(
                nvml=nvml, node=node, settings=settings, node_name="gpu-check", pod_resources_socket="", api=pods
            )
            started = time.perf_counter()
            snapshot = asyncio.run(usage.sample_once(holdings))  # type: ignore[arg-type]
            round_ms = (time.perf_counter() - started) * 1000
            time.sleep(1.2)  # past monitor.overuseSeconds: the second round acts on the over-use
            snapshot = asyncio.run(usage.sample_once(holdings))  # type: ignore[arg-type]
            if snapshot is None:
                raise CheckFailed("the monitor made no snapshot (see its log)")
            (sample,) = [d for d in snapshot.devices if d.uuid == device]
            (listed,) = gpu_usage.UsageReader(nvml, ((device, gpu),)).read()
            seen = {p.pid: p.used_mib for p in listed.processes}
            current.facts.update(allocated_mib=allocate_mib, processes=seen, round_ms=round_ms)
            current.say(f"{device}: NVML lists {seen} (PID: MiB); one monitor round {round_ms:.1f} ms")
            used = seen.get(child.pid)
            if used is None:
                raise CheckFailed(f"NVML does not list the CUDA process {child.pid}")
            if not allocate_mib <= used < allocate_mib + 2048:
                raise CheckFailed(f"NVML says {used} MiB for {allocate_mib} MiB allocated (+ context)")
            current.say(f"process {child.pid}: {used} MiB for {allocate_mib} MiB allocated (context {used - held} MiB)")
            if leaf is None:
                return
            containers = {(c.namespace, c.pod, c.container): c for c in snapshot.containers}
            use = containers.get(("gpu-check", "pod", "main"))
            if use is None or use.used_mib != used:
                raise CheckFailed(f"the container's use was not attributed: {snapshot.containers}")
            current.say(
                f"attributed to gpu-check/pod/main through its cgroup: {use.used_mib} MiB used, "
                f"{use.granted_mib} MiB granted; device unattributed {dict(sample.unknown_mib)}"
            )
            if not pods.events:
                raise CheckFailed("no over-use Event under the warn policy")
            current.say(f"Event {pods.events[0].reason}: {pods.events[0].message}")
        finally:
            child.close()


# --- 3. MPS ------------------------------------------------------------------------------------------------


def _mps_control() -> str | None:
    return shutil.which("nvidia-cuda-mps-control") or next(
        (
            str(p)
            for p in (pathlib.Path("/usr/local/nvidia/bin"), pathlib.Path("/usr/bin"))
            if (p / "nvidia-cuda-mps-control").is_file()
        ),
        None,
    )


def check_mps(current: Stage, nvml: Any, node: Any, limit_mib: int) -> None:
    from gpuslice.deviceplugin import gpu_usage

    control = _mps_control()
    if control is None:
        raise CheckSkipped("nvidia-cuda-mps-control is not installed (it comes with the driver's utilities)")
    shared = gpu_usage.shared_devices(node)
    if not shared:
        raise CheckSkipped("every GPU here is in MIG mode without MIG devices")
    device, gpu = shared[0]
    compute_mode = nvml.nvmlDeviceGetComputeMode(nvml.nvmlDeviceGetHandleByUUID(gpu))
    current.say(f"control binary {control}; compute mode {compute_mode} (left as it is)")
    work = pathlib.Path(tempfile.mkdtemp(prefix="gpuslice-mps-"))
    pipes, logs, shm = work / "pipe", work / "log", work / "shm"
    shm.mkdir()
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipes), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
    wrapper = [sys.executable, "-m", "gpuslice.mps.main", "--pipe-directory", str(pipes)]
    wrapper += ["--log-directory", str(logs), "--shm-directory", str(shm), "--control", control]
    daemon = subprocess.Popen(wrapper, env={**env, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    clients: list[CudaChild] = []
    try:
        deadline = time.monotonic() + 30
        while subprocess.run([*wrapper, "--check"], env={**env, "PYTHONPATH": str(ROOT)}).returncode != 0:
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise CheckFailed(f"the MPS control daemon did not answer (exit {daemon.poll()}); {_log(logs)}")
            time.sleep(0.5)
        current.say("gpuslice-mps-control-daemon up, answering get_default_active_thread_percentage")
        limited = CudaChild(
            {**env, "CUDA_VISIBLE_DEVICES": device, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={limit_mib}M"}
        )
        clients.append(limited)
        other = CudaChild(
            {**env, "CUDA_VISIBLE_DEVICES": device, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={4 * limit_mib}M"}
        )
        clients.append(other)
        ok, error, b_held = other.ask(f"alloc {2 * limit_mib}")
        if not ok:
            raise CheckFailed(
                f"client B could not allocate {2 * limit_mib} MiB under a {4 * limit_mib} MiB limit: {error}"
            )
        a_held, refused = 0, ""
        while a_held <= 2 * limit_mib:
            ok, error, a_held = limited.ask(f"alloc {_STEP_MIB}")
            if not ok:
                refused = error
                break
        current.facts.update(limit_mib=limit_mib, a_held_mib=a_held, a_error=refused, step_mib=_STEP_MIB)
        if not refused:
            raise CheckFailed(
                f"client A allocated {a_held} MiB under a {limit_mib} MiB limit: the limit is not applied"
            )
        current.say(f"client A (limit {limit_mib} MiB): {a_held} MiB in {_STEP_MIB} MiB steps, then {refused}")
        if a_held > limit_mib:
            raise CheckFailed(f"client A held {a_held} MiB, more than its limit of {limit_mib} MiB")
        ok, error, b_held = other.ask(f"alloc {limit_mib}")
        if not ok:
            raise CheckFailed(f"client B was refused {limit_mib} MiB more after A's failure: {error}")
        current.say(f"client B (limit {4 * limit_mib} MiB) still allocates: {b_held} MiB held")
        ok, error, _ = limited.ask("free")
        ok, error, after = limited.ask(f"alloc {_STEP_MIB}")
        if not ok:
            raise CheckFailed(f"client A could not allocate again after freeing: {error}")
        current.say(f"client A freed and allocated {after} MiB again: its context survived the refusal")
        listed = gpu_usage.UsageReader(nvml, ((device, gpu),)).read()[0]
        seen = {p.pid: p.used_mib for p in listed.processes}
        current.facts["processes"] = seen
        current.say(f"the monitor's reader lists {seen} (PID: MiB; clients {limited.pid}, {other.pid})")
        if limited.pid not in seen or other.pid not in seen:
            raise CheckFailed("the monitor's reader does not list both MPS clients")
    finally:
        for client in clients:
            client.close()
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait()
            current.say("the control daemon did not quit within 30 s: killed")
        shutil.rmtree(work, ignore_errors=True)
    current.say(f"daemon stopped (exit {daemon.returncode}), pipe directory removed")


def _log(logs: pathlib.Path) -> str:
    text = (logs / "control.log").read_text()[-400:] if (logs / "control.log").exists() else "no control.log"
    return f"control.log: {text!r}"


# --- main --------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", help="also write the results as JSON to this file")
    parser.add_argument("--allocate-mib", type=int, default=1024, help="what the monitor's child allocates")
    parser.add_argument("--mps-limit-mib", type=int, default=1024, help="client A's MPS memory limit")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child_main()
    if args.allocate_mib < 256 or args.mps_limit_mib < 2 * _STEP_MIB:
        parser.error(f"--allocate-mib must be at least 256 and --mps-limit-mib at least {2 * _STEP_MIB}")
    started = time.monotonic()
    stages: list[Stage] = []
    nvml = node = None
    with stage("nvml", stages) as current:
        nvml, node = check_nvml(current)
    if nvml is None:
        _finish(stages, args.report, started)
        return 2
    try:
        with stage("monitor", stages) as current:
            check_monitor(current, nvml, node, args.allocate_mib)
        with stage("mps", stages) as current:
            check_mps(current, nvml, node, args.mps_limit_mib)
    finally:
        nvml.nvmlShutdown()
    _finish(stages, args.report, started)
    return 1 if any(s.result == "FAIL" for s in stages) else 0


def _finish(stages: list[Stage], report: str | None, started: float) -> None:
    summary = ", ".join(f"{s.name} {s.result}" for s in stages)
    print(f"gpu-check: {summary} in {time.monotonic() - started:.1f} s", flush=True)
    if report:
        pathlib.Path(report).write_text(json.dumps([dataclasses.asdict(s) for s in stages], indent=2, default=str))


if __name__ == "__main__":
    sys.exit(main())
