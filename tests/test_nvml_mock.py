"""gpuslice's NVML code through nvidia-ml-py's real ctypes path, against a loadable NVML whose
answers come from NVIDIA's go-nvml mock DGX servers (e2e/nvml: built once per session by
e2e/nvml/build.sh, which needs Go and a C compiler; cached under ~/.cache/gpuslice-nvml).

Every check runs in a child process with LD_LIBRARY_PATH on the built library (glibc reads it at
process start), and the child's pynvml loads it as it would load the driver's. The tests set
processes, MIG layouts, XIDs and lost GPUs through the library's state file
($GPUSLICE_NVML_MOCK_STATE; schema in e2e/nvml/main.go). Without Go every test here skips with
one line; with GPUSLICE_REQUIRE_E2E=1 they fail instead.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

import pytest

pytestmark = pytest.mark.e2e

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
BUILD = REPO / "e2e" / "nvml" / "build.sh"
H200_RECORD = REPO / "docs" / "gpu-check" / "h200-2026-11-28.json"
STATE_ENV = "GPUSLICE_NVML_MOCK_STATE"
REQUIRE_ENV = "GPUSLICE_REQUIRE_E2E"
NOT_MIG_SPECIFIC = 0xFFFFFFFF
MIB = 1 << 20
A100_LAYOUT = {"0": ["2g.10gb", "1c.2g.10gb", "1g.5gb+me", "1g.5gb"], "1": []}
NO_GO = "the loadable NVML mock is not built: needs Go (e2e/nvml/build.sh)"

# Without Go the whole file is one skip line; with GPUSLICE_REQUIRE_E2E=1 the fixture fails instead.
# (A child process imports this module too: its environment names a state file.)
if (
    shutil.which("go") is None
    and not os.environ.get("GPUSLICE_NVML_DIR")
    and os.environ.get(REQUIRE_ENV) != "1"
    and STATE_ENV not in os.environ
):
    pytest.skip(NO_GO, allow_module_level=True)


# --- the library and the child processes --------------------------------------------------------


@pytest.fixture(scope="session")
def nvml_dir() -> pathlib.Path:
    """The directory holding the built libnvidia-ml.so.1 ($GPUSLICE_NVML_DIR, else built now)."""

    def unavailable(reason: str) -> NoReturn:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but {reason}", pytrace=False)
        pytest.skip(reason)

    given = os.environ.get("GPUSLICE_NVML_DIR")
    if given:
        if not (pathlib.Path(given) / "libnvidia-ml.so.1").is_file():
            unavailable(f"GPUSLICE_NVML_DIR={given} has no libnvidia-ml.so.1")
        return pathlib.Path(given)
    if shutil.which("go") is None:
        unavailable(NO_GO)
    build = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=540)  # < pytest timeout
    if build.returncode != 0:
        unavailable(f"e2e/nvml/build.sh failed ({build.returncode}): {build.stderr.strip()[-2000:]}")
    return pathlib.Path(build.stdout.strip().splitlines()[-1])


def write_state(path: pathlib.Path, state: dict[str, Any]) -> None:
    """Replace the state file at once (the library reads it on every query)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(state))
    os.replace(partial, path)


def run_child(
    nvml_dir: pathlib.Path,
    tmp_path: pathlib.Path,
    child: Callable[[], Any],
    *,
    machine: str = "dgxa100",
    state: dict[str, Any] | None = None,
) -> Any:
    """`child()` run in a fresh Python with the mock NVML on its library path; its JSON answer."""
    state_file = tmp_path / "nvml-state.json"
    if state is not None:
        write_state(state_file, state)
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(nvml_dir), os.environ.get("LD_LIBRARY_PATH")])),
        "GPUSLICE_NVML_MOCK_MACHINE": machine,
        STATE_ENV: str(state_file),
    }
    code = f"import sys; sys.path.insert(0, {str(HERE)!r}); import test_nvml_mock as t; t.child_main(sys.argv[1])"
    done = subprocess.run(
        [sys.executable, "-c", code, child.__name__], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{child.__name__} failed in the child:\n{done.stderr}"
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer.pop("loaded") == [str(nvml_dir / "libnvidia-ml.so.1")], "pynvml loaded another libnvidia-ml"
    return answer


def child_main(name: str) -> None:
    """In the child: run child function `name` and print its answer as the last line."""
    answer = globals()[name]()
    maps = pathlib.Path("/proc/self/maps").read_text().splitlines()
    answer["loaded"] = sorted({line.split()[-1] for line in maps if "libnvidia-ml" in line})
    print(json.dumps(answer, default=str))


def outcome(function: Callable[..., Any], *args: Any) -> dict[str, Any]:
    """What a pynvml call answers, as tools/gpu-check.py records it: a value or the class it raises."""
    import pynvml

    try:
        value = function(*args)
    except pynvml.NVMLError as exc:
        return {"raises": type(exc).__name__}
    return {"value": plain(value)}


def plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, list):
        return [plain(v) for v in value]
    if hasattr(value, "_fields_"):
        return {name: plain(getattr(value, name)) for name, *_ in value._fields_}
    if hasattr(value, "__dict__") and not isinstance(value, type):  # pynvml's friendly objects
        return {k: plain(v) for k, v in vars(value).items()}
    return value


def state_file() -> pathlib.Path:
    return pathlib.Path(os.environ[STATE_ENV])


def read_state() -> dict[str, Any]:
    path = state_file()
    return json.loads(path.read_text()) if path.exists() else {}


# --- discovery ----------------------------------------------------------------------------------


def child_discovery() -> dict[str, Any]:
    import pynvml
    import yaml

    from gpuslice.node import nodefile, nvml_source

    nvml = nvml_source.load_pynvml()
    node = nvml_source.discover(nvml)
    again = nodefile.parse(yaml.safe_load(nodefile.dump(node)))
    mig_ids = {
        g.uuid: nvml_source.mig_instance_ids(nvml, pynvml.nvmlDeviceGetHandleByIndex(g.index))
        for g in node.gpus
        if g.mig_enabled
    }
    answer = {
        "gpus": [dataclasses.asdict(g) for g in node.gpus],
        "node_file_round_trip": again.gpus == node.gpus,
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "mig_ids": {uuid: {f"{gi},{ci}": mig for (gi, ci), mig in ids.items()} for uuid, ids in mig_ids.items()},
    }
    nvml.nvmlShutdown()
    return answer


def test_discovery_through_pynvml_finds_the_eight_a100s_of_the_dgx_mock(nvml_dir, tmp_path):
    first = run_child(nvml_dir, tmp_path, child_discovery)
    gpus = first["gpus"]
    assert [g["index"] for g in gpus] == list(range(8))
    assert {g["model"] for g in gpus} == {"NVIDIA A100-SXM4-40GB"}  # the mock's "Mock NVIDIA ..." corrected
    assert {g["memory_mib"] for g in gpus} == {40960}
    assert all(re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", g["uuid"]) for g in gpus)
    assert len({g["uuid"] for g in gpus}) == 8
    assert [g["pci_bus_id"] for g in gpus] == [f"00000000:{i:02X}:00.0" for i in range(8)]  # NVML's format
    assert [g["minor_number"] for g in gpus] == list(range(8))
    assert {g["numa_node"] for g in gpus} == {None}  # NotSupported, as the measured VM answered
    assert not any(g["mig_enabled"] or g["mig"] or g["nvlinks"] for g in gpus)
    assert first["node_file_round_trip"] and first["driver"] == "550.54.15"  # the mock's driver
    # Real UUIDs do not change between processes (the mock draws new ones each time).
    assert run_child(nvml_dir, tmp_path, child_discovery)["gpus"] == gpus


def child_switches() -> dict[str, Any]:
    import pynvml

    from gpuslice.node import nvml_source

    nvml = nvml_source.load_pynvml()
    node = nvml_source.discover(nvml)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    return {
        "nvlinks": [g.nvlinks for g in node.gpus],
        "uuids": [g.uuid for g in node.gpus],
        "link_17": outcome(pynvml.nvmlDeviceGetNvLinkState, handle, 17),
        "link_18": outcome(pynvml.nvmlDeviceGetNvLinkState, handle, 18),
        "remote": outcome(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, 0),
    }


def test_gpus_on_nvswitches_are_each_others_peers_through_the_real_nvlink_calls(nvml_dir, tmp_path):
    answer = run_child(nvml_dir, tmp_path, child_switches, machine="dgxh100", state={"nvswitch": True})
    uuids = answer["uuids"]
    for own, links in zip(uuids, answer["nvlinks"], strict=True):
        assert links == {peer: 18 for peer in uuids if peer != own}  # 18 links, all to NVSwitches
    assert answer["link_17"] == {"value": 1} and answer["link_18"] == {"raises": "NVMLError_InvalidArgument"}
    assert answer["remote"]["value"]["busId"] not in {f"00000000:{i:02X}:00.0" for i in range(8)}


# --- the measured H200 --------------------------------------------------------------------------


def child_h200_raw() -> dict[str, Any]:
    """The raw calls tools/gpu-check.py made on the real H200, made here the same way."""
    import pynvml

    from gpuslice.node import nvml_source

    nvml = nvml_source.load_pynvml()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    calls: dict[str, tuple[Any, ...]] = {
        "nvmlDeviceGetUUID": (handle,),
        "nvmlDeviceGetName": (handle,),
        "nvmlDeviceGetPciInfo": (handle,),
        "nvmlDeviceGetMemoryInfo": (handle,),
        "nvmlDeviceGetMinorNumber": (handle,),
        "nvmlDeviceGetNumaNodeId": (handle,),
        "nvmlDeviceGetMigMode": (handle,),
        "nvmlDeviceGetMaxMigDeviceCount": (handle,),
        "nvmlDeviceGetMigDeviceHandleByIndex": (handle, 0),
        "nvmlDeviceGetUtilizationRates": (handle,),
        "nvmlDeviceGetComputeRunningProcesses": (handle,),
        "nvmlDeviceGetGraphicsRunningProcesses": (handle,),
        "nvmlDeviceGetMPSComputeRunningProcesses": (handle,),
        "nvmlDeviceGetProcessUtilization": (handle, int((time.time() - 20) * 1e6)),
        "nvmlDeviceGetNvLinkState": (handle, 0),
        "nvmlDeviceGetSupportedEventTypes": (handle,),
        "nvmlDeviceGetComputeMode": (handle,),
        "nvmlDeviceGetHandleByUUID": ("GPU-00000000-0000-0000-0000-000000000000",),
        "nvmlDeviceGetGpuInstanceProfileInfo": (handle, 0),
    }
    raw = {name: outcome(getattr(pynvml, name), *args) for name, args in calls.items()}
    event_set = pynvml.nvmlEventSetCreate()
    raw["nvmlDeviceRegisterEvents(xid)"] = outcome(
        pynvml.nvmlDeviceRegisterEvents, handle, pynvml.nvmlEventTypeXidCriticalError, event_set
    )
    started = time.monotonic()
    raw["nvmlEventSetWait(100 ms)"] = outcome(pynvml.nvmlEventSetWait, event_set, 100)
    waited = time.monotonic() - started
    pynvml.nvmlEventSetFree(event_set)
    nvml.nvmlShutdown()
    return {"raw": raw, "waited": waited, "after_shutdown": outcome(pynvml.nvmlDeviceGetCount)}


def test_the_h200_mock_answers_every_raw_call_as_the_measured_h200_did(nvml_dir, tmp_path):
    record = next(stage for stage in json.loads(H200_RECORD.read_text()) if stage["name"] == "nvml")
    measured = record["facts"]["raw"]
    answer = run_child(nvml_dir, tmp_path, child_h200_raw, machine="dgxh200")
    mock = answer["raw"]
    differing = {"nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo"}  # this GPU's own identity: checked by form below
    for call, fact in measured.items():
        if call in mock and call not in differing:
            if call == "nvmlDeviceGetGpuInstanceProfileInfo":  # its `version`: what the caller's pynvml put in
                fact = {"value": {k: v for k, v in fact["value"].items() if k != "version"}}
                mock[call]["value"].pop("version")
            assert {k: v for k, v in mock[call].items() if k != "type"} == {
                k: v for k, v in fact.items() if k != "type"
            }, call
    assert set(measured) - set(mock) == {"NVML_NVLINK_MAX_LINKS", "NVML_VALUE_NOT_AVAILABLE"}  # module constants
    assert re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", mock["nvmlDeviceGetUUID"]["value"])
    pci = mock["nvmlDeviceGetPciInfo"]["value"]
    assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.0", pci["busId"])
    assert pci["busIdLegacy"] == pci["busId"][4:] and pci["domain"] == 0
    assert answer["waited"] >= 0.1  # the wait waits out its timeout before NVML_ERROR_TIMEOUT
    assert answer["after_shutdown"] == {"raises": "NVMLError_Uninitialized"}


def child_h200_mig() -> dict[str, Any]:
    import pynvml

    from gpuslice.node import nvml_source

    nvml = nvml_source.load_pynvml()
    node = nvml_source.discover(nvml)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    names = {}
    for constant in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        info = outcome(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, handle, constant)
        if "value" in info:
            names[info["value"]["name"]] = info["value"]["id"]
    return {"nvml_names": names, "discovered": [m.profile for m in node.gpus[0].mig]}


def test_mig_profile_names_on_an_h200_are_the_names_nvml_gives_them(nvml_dir, tmp_path):
    layout = {"mig": {"0": ["3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"]}}
    answer = run_child(nvml_dir, tmp_path, child_h200_mig, machine="dgxh200", state=layout)
    assert answer["nvml_names"]["MIG 3g.71gb"] == 9 and answer["nvml_names"]["MIG 1g.18gb"] == 19
    assert answer["discovered"] == ["3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"]


# --- MIG ----------------------------------------------------------------------------------------


def test_mig_devices_made_through_the_mocks_mig_api_are_discovered_with_nvidias_names(nvml_dir, tmp_path):
    answer = run_child(nvml_dir, tmp_path, child_discovery, state={"mig": A100_LAYOUT})
    first, second, *rest = answer["gpus"]
    assert first["mig_enabled"] and second["mig_enabled"] and not any(g["mig_enabled"] for g in rest)
    assert [(m["profile"], m["memory_mib"]) for m in first["mig"]] == [
        ("2g.10gb", 9856),
        ("1c.2g.10gb", 9856),
        ("1g.5gb+me", 4864),
        ("1g.5gb", 4864),
    ]
    assert all(m["uuid"].startswith("MIG-") and m["parent_uuid"] == first["uuid"] for m in first["mig"])
    assert second["mig"] == []  # MIG on, no instance made
    # health.py names MIG devices in XID events by (GPU instance, compute instance) ids
    assert answer["mig_ids"][first["uuid"]] == {f"{i},0": m["uuid"] for i, m in enumerate(first["mig"])}
    assert answer["mig_ids"][second["uuid"]] == {}
    assert answer["node_file_round_trip"]


def child_mig_refused() -> dict[str, Any]:
    from gpuslice.node import nvml_source

    try:
        nvml_source.load_pynvml()
    except nvml_source.NvmlUnavailable as exc:
        return {"error": str(exc)}
    return {"error": None}


def test_a_mig_layout_the_gpu_cannot_hold_fails_nvml_init(nvml_dir, tmp_path):
    # 3g + 2g + 2g take the A100's eight memory slices: no placement is left for a 1g.
    layout = {"mig": {"0": ["3g.20gb", "2g.10gb", "2g.10gb", "1g.5gb"]}}
    assert "NVML could not be initialised" in run_child(nvml_dir, tmp_path, child_mig_refused, state=layout)["error"]


# --- processes, memory, utilisation -------------------------------------------------------------


def child_usage() -> dict[str, Any]:
    import pynvml

    from gpuslice.deviceplugin import gpu_usage
    from gpuslice.node import nvml_source

    nvml = nvml_source.load_pynvml()
    node = nvml_source.discover(nvml)
    gpus = [g.uuid for g in node.gpus]
    mig = node.gpus[0].mig[0].uuid
    state = read_state()
    state["processes"] = {
        gpus[2]: [
            {"pid": 4242, "usedMiB": 2048, "smUtil": 40},
            {"pid": 4243, "usedMiB": 512, "kind": "graphics"},
            {"pid": 4244, "usedMiB": None, "kind": "mps"},
            {"pid": 4245, "usedMiB": 256, "kind": "compute+graphics"},
        ],
        mig: [{"pid": 5151, "usedMiB": 1000, "smUtil": 10}],
    }
    write_state(state_file(), state)
    reader = gpu_usage.UsageReader(nvml, gpu_usage.shared_devices(node))
    first = {s.uuid: dataclasses.asdict(s) for s in reader.read()}
    second = {s.uuid: dataclasses.asdict(s) for s in reader.read()}  # no newer utilisation sample
    raw = {
        kind: outcome(getattr(pynvml, f"nvmlDevice{kind}RunningProcesses"), pynvml.nvmlDeviceGetHandleByUUID(gpus[2]))
        for kind in ("GetCompute", "GetGraphics", "GetMPSCompute")
    }
    parent = pynvml.nvmlDeviceGetHandleByUUID(gpus[0])
    raw["parent_processes"] = outcome(pynvml.nvmlDeviceGetComputeRunningProcesses, parent)
    raw["parent_used"] = outcome(pynvml.nvmlDeviceGetMemoryInfo, parent)
    raw["parent_utilization"] = outcome(pynvml.nvmlDeviceGetUtilizationRates, parent)
    del state["processes"][gpus[2]][0]  # pid 4242 exits
    write_state(state_file(), state)
    third = {s.uuid: dataclasses.asdict(s) for s in reader.read()}
    return {"gpus": gpus, "mig": mig, "first": first, "second": second, "third": third, "raw": raw}


def test_the_usage_reader_lists_the_processes_and_memory_the_state_file_sets(nvml_dir, tmp_path):
    answer = run_child(nvml_dir, tmp_path, child_usage, state={"mig": A100_LAYOUT, "baselineMiB": 100})
    gpus, mig, first = answer["gpus"], answer["mig"], answer["first"]
    busy = first[gpus[2]]
    assert busy["error"] is None
    assert busy["processes"] == [
        {"pid": 4242, "used_mib": 2048},
        {"pid": 4243, "used_mib": 512},
        {"pid": 4244, "used_mib": None},  # NVML_VALUE_NOT_AVAILABLE
        {"pid": 4245, "used_mib": 256},  # compute and graphics: listed twice by NVML, once here
    ]
    assert busy["used_mib"] == 100 + 2048 + 512 + 256 and busy["total_mib"] == 40960
    assert busy["process_utilization"] == {"4242": 40} and busy["utilization"] == 0
    assert answer["second"][gpus[2]]["process_utilization"] == {}  # NotFound: no sample since the last
    idle = first[gpus[3]]
    assert idle["processes"] == [] and idle["used_mib"] == 100 and idle["process_utilization"] == {}
    on_mig = first[mig]
    assert on_mig["processes"] == [{"pid": 5151, "used_mib": 1000}] and on_mig["used_mib"] == 1000
    assert on_mig["utilization"] is None and on_mig["process_utilization"] is None  # NotSupported on MIG
    assert gpus[0] not in first and gpus[1] not in first  # MIG-enabled GPUs are not shared devices
    third = answer["third"][gpus[2]]
    assert [p["pid"] for p in third["processes"]] == [4243, 4244, 4245] and third["used_mib"] == 100 + 512 + 256
    raw = answer["raw"]
    assert [p["pid"] for p in raw["GetCompute"]["value"]] == [4242, 4245]
    assert [p["pid"] for p in raw["GetGraphics"]["value"]] == [4243, 4245]
    assert raw["GetMPSCompute"]["value"] == [
        {"pid": 4244, "usedGpuMemory": None, "gpuInstanceId": NOT_MIG_SPECIFIC, "computeInstanceId": NOT_MIG_SPECIFIC}
    ]
    # A MIG-enabled GPU lists its MIG devices' processes with their instance ids, and counts them.
    assert raw["parent_processes"]["value"] == [
        {"pid": 5151, "usedGpuMemory": 1000 * MIB, "gpuInstanceId": 0, "computeInstanceId": 0}
    ]
    assert raw["parent_used"]["value"]["used"] == (100 + 1000) * MIB
    assert raw["parent_utilization"] == {"raises": "NVMLError_NotSupported"}


def child_lost() -> dict[str, Any]:
    import pynvml

    from gpuslice.deviceplugin import gpu_usage
    from gpuslice.node import nvml_source

    nvml = nvml_source.load_pynvml()
    node = nvml_source.discover(nvml)
    gpus = [g.uuid for g in node.gpus]
    held = pynvml.nvmlDeviceGetHandleByIndex(5)
    write_state(state_file(), {"lost": [gpus[5]]})
    samples = {s.uuid: s.error for s in gpu_usage.UsageReader(nvml, gpu_usage.shared_devices(node)).read()}
    answer = {
        "gpus": gpus,
        "samples": samples,
        "memory_of_held_handle": outcome(pynvml.nvmlDeviceGetMemoryInfo, held),
        "by_index_lost": outcome(pynvml.nvmlDeviceGetHandleByIndex, 5),
        "by_index_other": "value" in outcome(pynvml.nvmlDeviceGetHandleByIndex, 4),
        "by_uuid_other": outcome(pynvml.nvmlDeviceGetHandleByUUID, gpus[4]),
    }
    write_state(state_file(), {})
    answer["back"] = outcome(pynvml.nvmlDeviceGetMemoryInfo, held)
    return answer


def test_a_lost_gpu_answers_gpu_is_lost_through_pynvml(nvml_dir, tmp_path):
    answer = run_child(nvml_dir, tmp_path, child_lost)
    lost = answer["gpus"][5]
    assert answer["samples"][lost] == "NVMLError_GpuIsLost: GPU is lost"
    assert answer["memory_of_held_handle"] == {"raises": "NVMLError_GpuIsLost"}
    assert answer["by_index_lost"] == {"raises": "NVMLError_GpuIsLost"} and answer["by_index_other"]
    # nvml.h: nvmlDeviceGetHandleByUUID fails "if any GPU has fallen off the bus"
    assert answer["by_uuid_other"] == {"raises": "NVMLError_GpuIsLost"}
    assert answer["back"]["value"]["total"] == 40960 * MIB


def test_one_lost_gpu_leaves_the_others_readable(nvml_dir, tmp_path):
    answer = run_child(nvml_dir, tmp_path, child_lost)
    others = {uuid: error for uuid, error in answer["samples"].items() if uuid != answer["gpus"][5]}
    assert others and all(error is None for error in others.values())


# --- health events ------------------------------------------------------------------------------


def child_health() -> dict[str, Any]:
    from gpuslice import config
    from gpuslice.node import health, nvml_source

    nvml = nvml_source.load_pynvml()
    node = nvml_source.discover(nvml)
    gpus = [g.uuid for g in node.gpus]
    mig = node.gpus[0].mig[2].uuid

    async def watch() -> dict[str, Any]:
        state = health.HealthState()
        settings = config.HealthConfig(event_timeout_ms=50, recovery_interval_seconds=3600)
        monitor = health.HealthMonitor(nvml, node, settings, state)
        await monitor.start()
        seen: dict[str, Any] = {}
        try:
            await asyncio.sleep(0.5)  # several waits time out: nothing is marked
            seen["after_timeouts"] = sorted(state.unhealthy)

            async def xid(uuid: str, number: int) -> None:
                current = read_state()
                current.setdefault("xids", []).append({"uuid": uuid, "xid": number})
                write_state(state_file(), current)
                await asyncio.sleep(0.4)

            await xid(gpus[4], 13)  # an application XID: ignored
            seen["after_xid_13"] = sorted(state.unhealthy)
            await xid(gpus[3], 79)
            seen["after_xid_79"] = sorted(state.unhealthy)
            await xid(mig, 48)  # on a MIG device: the event names its GPU and instance ids
            seen["after_mig_xid"] = sorted(state.unhealthy)
            seen["reasons"] = dict(state.reasons)
        finally:
            await monitor.stop()
        return seen

    answer = asyncio.run(watch())
    answer.update(gpus=gpus, mig=mig)
    return answer


def test_health_registers_for_xids_waits_out_timeouts_and_marks_the_device_an_event_names(nvml_dir, tmp_path):
    answer = run_child(nvml_dir, tmp_path, child_health, state={"mig": A100_LAYOUT})
    gpus, mig = answer["gpus"], answer["mig"]
    assert answer["after_timeouts"] == [] and answer["after_xid_13"] == []
    assert answer["after_xid_79"] == [gpus[3]]
    assert answer["after_mig_xid"] == sorted([gpus[3], mig])
    assert answer["reasons"] == {gpus[3]: "XID 79", mig: "XID 48"}


def child_health_lost() -> dict[str, Any]:
    from gpuslice import config
    from gpuslice.node import health, nvml_source

    nvml = nvml_source.load_pynvml()
    node = nvml_source.discover(nvml)
    gpus = [g.uuid for g in node.gpus]

    async def watch() -> dict[str, Any]:
        state = health.HealthState()
        settings = config.HealthConfig(event_timeout_ms=50, recovery_interval_seconds=0.5)
        monitor = health.HealthMonitor(nvml, node, settings, state)
        await monitor.start()
        seen: dict[str, Any] = {}
        try:
            write_state(state_file(), {"lost": [gpus[2]]})
            await asyncio.sleep(0.4)  # the event wait fails: GPU_IS_LOST
            seen["while_lost"] = sorted(state.unhealthy)
            write_state(state_file(), {})
            for _ in range(40):  # recovery probes every 0.5 s, after a quiet interval
                await asyncio.sleep(0.1)
                if not state.unhealthy:
                    break
            seen["after_recovery"] = sorted(state.unhealthy)
        finally:
            await monitor.stop()
        return seen

    answer = asyncio.run(watch())
    answer["gpus"] = gpus
    return answer


def test_a_lost_gpu_fails_the_event_wait_but_only_it_is_marked_and_it_recovers(nvml_dir, tmp_path):
    """nvml.h: the event wait (and every lookup by UUID) fails once any GPU has fallen off the bus.
    The health monitor must then name the GPU that stopped answering, not every device."""
    answer = run_child(nvml_dir, tmp_path, child_health_lost)
    assert answer["while_lost"] == [answer["gpus"][2]]
    assert answer["after_recovery"] == []


def child_dra_slices() -> dict[str, Any]:
    import contextlib
    import io

    import yaml

    from gpuslice.dra import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main.main(["--print-resource-slices"])
    slices = list(yaml.safe_load_all(out.getvalue()))
    return {"status": status, "slices": slices}


def test_the_dra_plugin_publishes_what_nvml_reports_of_the_mock_gpus(nvml_dir, tmp_path):
    """`gpuslice-dra-plugin --print-resource-slices` with no node file: discovery through pynvml."""
    answer = run_child(nvml_dir, tmp_path, child_dra_slices, machine="dgxh200", state={"mig": {"0": ["3g.71gb"]}})
    assert answer["status"] == 0
    devices = [d for s in answer["slices"] for d in s["spec"].get("devices") or ()]
    shared = [d for d in devices if d["attributes"]["type"]["string"] == "gpu"]
    mig = [d for d in devices if d["attributes"]["type"]["string"] == "mig"]
    memory = {d["capacity"]["gpu.gpuslice.io/memory"]["value"] for d in shared}
    assert len(shared) == 7 and memory == {"143771Mi"}, shared[0]
    assert [d["attributes"]["migProfile"]["string"] for d in mig] == ["3g.71gb"]


# --- no driver, missing functions ---------------------------------------------------------------


def child_no_driver() -> dict[str, Any]:
    from gpuslice.node import nvml_source

    try:
        nvml_source.load_node(None)
    except nvml_source.DiscoveryFailed as exc:
        return {"status": exc.status, "message": str(exc)}
    return {"status": None}


def test_a_node_without_a_driver_is_reported_as_no_nvml(nvml_dir, tmp_path):
    answer = run_child(nvml_dir, tmp_path, child_no_driver, machine="none")
    assert answer["status"] == 1 and "Driver Not Loaded" in answer["message"]


def child_functions() -> dict[str, Any]:
    import pynvml

    from gpuslice.node import nvml_source

    nvml_source.load_pynvml()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    exported = (pathlib.Path(os.environ["LD_LIBRARY_PATH"].split(os.pathsep)[0]) / "EXPORTS").read_text().split()
    return {
        "exported": exported,
        "found": [name for name in exported if hasattr(pynvml.nvmlLib, name)],
        "brand": outcome(pynvml.nvmlDeviceGetBrand, handle),
        "mig_attributes_of_a_gpu": outcome(pynvml.nvmlDeviceGetAttributes, handle),
    }


def test_only_the_implemented_nvml_functions_are_exported(nvml_dir, tmp_path):
    answer = run_child(nvml_dir, tmp_path, child_functions)
    assert len(answer["exported"]) >= 40 and answer["found"] == answer["exported"]
    assert all(name.startswith("nvml") for name in answer["exported"])
    assert answer["brand"] == {"raises": "NVMLError_FunctionNotFound"}  # not exported: pynvml finds no symbol
    assert answer["mig_attributes_of_a_gpu"] == {"raises": "NVMLError_NotSupported"}
