"""A recorded corpus of admissions and the webhook's answers to them (issue 36): the proof that a
change to the steering or to the answer cache gives the same bytes for the same reviews.

Five sessions, one per configuration that changes what the webhook writes (the defaults, pacing
with the pacer coming and going, CPU-pod steering off, the nearly-full band always on with another
CPU per GPU, steering off). Each is a sequence of events against one cluster view: nodes labelled
as the device plugin labels them (and relabelled as GPUs fill and empty), the pacer's liveness,
the clock moving on, and AdmissionReviews of varied pods answered through `repeats.RepeatAnswers`,
replicas of one template among them so that answers are given from memory, by bytes and by fields.

    .venv/bin/python tests/answercorpus.py     # records tests/data/webhook_answers.json.gz

Recorded once, from the code before the steering became objects; tests/webhook/test_repeats_corpus.py
replays it. The node labels are stored, not rebuilt, so the corpus does not move with the label code.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import pathlib
import random
import sys
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import reviewkit  # noqa: E402

from gpuslice import config  # noqa: E402
from gpuslice.node import labels as node_labels  # noqa: E402
from gpuslice.node import nodefile  # noqa: E402
from gpuslice.sim import trace  # noqa: E402
from gpuslice.webhook import cluster, repeats  # noqa: E402

CORPUS = HERE / "data" / "webhook_answers.json.gz"
EXAMPLES = HERE.parent / "gpuslice" / "examples"
BASE = config.Config()


def _steering(**changes: Any) -> config.Config:
    return dataclasses.replace(BASE, steering=dataclasses.replace(BASE.steering, **changes))


SETTINGS: dict[str, config.Config] = {
    "defaults": BASE,
    "pacing": dataclasses.replace(BASE, pacing=dataclasses.replace(BASE.pacing, enabled=True)),
    "no-cpu-pods": dataclasses.replace(_steering(cpu_pods=False), convert_whole_gpus=False),
    "band-always": _steering(cpu_pods_nearly_full_cpu_percent=0, cpu_per_gpu_milli=8000),
    "steering-off": _steering(enabled=False),
}


class Clock:
    """The promises' clock: moved by the events, not by the machine."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- the cluster ------------------------------------------------------------------------------

_TRACE_NODES = (
    trace.TraceNode("t4-a", 64000, 262144, 2, "T4"),
    trace.TraceNode("v100-a", 96000, 393216, 8, "V100M32"),
    trace.TraceNode("a10-a", 32000, 131072, 1, "A10"),
    trace.TraceNode("v100-b", 96000, 393216, 8, "V100M32"),
)


def _inventories() -> dict[str, Any]:
    nodes = {"demo": nodefile.load(EXAMPLES / "demo-node.yaml"), "h200": nodefile.load(EXAMPLES / "h200x8-node.yaml")}
    nodes.update({n.name: trace.node_inventory(n) for n in _TRACE_NODES})
    return nodes


def _labels(inventory: Any, contract: Any, rng: random.Random, fill: float, cpu_per_gpu: int) -> dict[str, str]:
    """The node's labels with about `fill` of each GPU's units taken, and some CPU and memory headroom."""
    taken = {}
    for gpu in inventory.memory_gpus:
        units = contract.units_per_gpu(gpu.memory_mib)
        taken[gpu.uuid] = 0 if rng.random() > fill else rng.randint(1, units)
    headroom = (rng.choice((4000, 16000, 40000, 90000)), rng.choice((16384, 65536, 200000)))
    score = rng.choice((None, 30, 55, 85))
    return node_labels.node_labels(
        inventory, contract, allocated=taken, placement_score=score, headroom=headroom, cpu_per_gpu_milli=cpu_per_gpu
    )


# --- the pods ---------------------------------------------------------------------------------


def _container(name: str = "main", image: str = "registry.example/train:1.0", **resources: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "image": image}
    if resources:
        body["resources"] = resources
    return body


def _pod(
    template: str,
    annotations: dict[str, str] | None,
    containers: list[dict[str, Any]],
    *,
    owner: str = "ReplicaSet",
    name: str | None = None,
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"namespace": "team-a", "labels": {"app": template, **(labels or {})}}
    if name is None:
        metadata["generateName"] = f"{template}-7c9f8d6b5-"
    else:
        metadata["name"] = name
    if annotations:
        metadata["annotations"] = annotations
    if owner:
        metadata["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": owner, "name": template, "uid": f"uid-of-{template}", "controller": True}
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "containers": containers,
            "restartPolicy": "Always",
            "schedulerName": "default-scheduler",
            "terminationGracePeriodSeconds": 30,
            **spec,
        },
    }


def _cpu(cpu: str, memory: str = "4Gi", **extra: str) -> dict[str, Any]:
    return {"requests": {"cpu": cpu, "memory": memory, **extra}, "limits": {"memory": memory, **extra}}


def _templates(contract: Any) -> list[tuple[str, dict[str, Any]]]:
    """(template name, pod): the kinds of pod the webhook sees, each sent as several replicas."""
    gpu1 = {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "6", "memory": "24Gi"}}
    any_class = contract.gpu_class_annotation
    own_affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]
            }
        }
    }
    out: list[tuple[str, dict[str, Any]]] = []
    for fraction in ("0.1", "0.25", "0.5", "0.75"):
        name = f"frac-{fraction[2:]}"
        out.append((name, _pod(name, {"gpu-fraction": fraction}, [_container(resources=gpu1)])))
        name = f"frac-any-{fraction[2:]}"
        out.append((name, _pod(name, {"gpu-fraction": fraction, any_class: "any"}, [_container(resources=gpu1)])))
    for cpu in ("2", "12", "30"):
        name = f"frac-cpu-{cpu}"
        resources = {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": cpu, "memory": "8Gi"}}
        out.append((name, _pod(name, {"gpu-fraction": "0.5"}, [_container(resources=resources)])))
    for mib in ("3000", "12000", "20000", "70000", "100000"):
        out.append((f"mem-{mib}", _pod(f"mem-{mib}", {"gpu-memory": mib}, [_container()])))
    for gpus in ("1", "2", "4", "8"):
        resources = {"limits": {"nvidia.com/gpu": gpus}, "requests": {"cpu": str(8 * int(gpus)), "memory": "64Gi"}}
        out.append((f"whole-{gpus}", _pod(f"whole-{gpus}", None, [_container(resources=resources)])))
    out.append(
        ("frac-devs", _pod("frac-devs", {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}, [_container()]))
    )
    out.append(("mig-nv", _pod("mig-nv", None, [_container(resources={"limits": {"nvidia.com/mig-1g.10gb": "1"}})])))
    out.append(("hami", _pod("hami", None, [_container(resources={"limits": {"nvidia.com/gpumem": "6000"}})])))
    out.append(("frac-kai", _pod("frac-kai", {"gpu-fraction": "0.5"}, [_container()], schedulerName="kai-scheduler")))
    out.append(("frac-aff", _pod("frac-aff", {"gpu-fraction": "0.25"}, [_container()], affinity=own_affinity)))
    out.append(
        (
            "frac-two",
            _pod(
                "frac-two",
                {"gpu-fraction": "0.5", "gpu-fraction-container-name": "b"},
                [_container("a"), _container("b")],
            ),
        )
    )
    out.append(("bad-frac", _pod("bad-frac", {"gpu-fraction": "1.5"}, [_container()])))
    out.append(("too-big", _pod("too-big", {"gpu-memory": "900000"}, [_container()])))
    for cpu in ("500m", "4", "16", "48"):
        out.append((f"cpu-{cpu}", _pod(f"cpu-{cpu}", None, [_container(resources=_cpu(cpu))])))
    out.append(("cpu-bare", _pod("cpu-bare", None, [_container()], owner="")))
    out.append(("cpu-kai", _pod("cpu-kai", None, [_container(resources=_cpu("2"))], schedulerName="kai-scheduler")))
    out.append(("cpu-ds", _pod("cpu-ds", None, [_container(resources=_cpu("1"))], owner="DaemonSet")))
    out.append(
        (
            "cpu-off",
            _pod("cpu-off", None, [_container(resources=_cpu("3"))], labels={contract.label_pod_cpu_steering: "off"}),
        )
    )
    return out


def _review(pod: dict[str, Any], uid: str, rng: random.Random) -> str:
    dry_run = rng.random() < 0.03
    return json.dumps(reviewkit.pod_create(pod, uid=uid, dry_run=dry_run), separators=(",", ":"))


# --- the sessions -----------------------------------------------------------------------------


def events(session: str, seed: int) -> list[dict[str, Any]]:
    """The events of one session (no answers yet)."""
    settings = SETTINGS[session]
    contract = settings.contract
    rng = random.Random(seed)
    inventories = _inventories()
    per_gpu = settings.steering.cpu_per_gpu_milli
    out: list[dict[str, Any]] = []
    for name, inventory in inventories.items():
        out.append({"node": name, "labels": _labels(inventory, contract, rng, 0.3, per_gpu)})
    if session == "pacing":
        out.append({"pacer": ""})
    # The CPU asked so far (webhook/cpudemand.py): GPU pods only, so the nearly-full band starts off.
    out.append({"demand": {"cpu": 8000, "device": True, "times": 600}})
    templates = _templates(contract)
    serial = 0
    for step in range(36):
        name, pod = rng.choice(templates)
        replicas = rng.choice((1, 1, 2, 3, 5, 8))
        stateful = rng.random() < 0.2  # pods that differ by name: remembered by fields, not bytes
        for replica in range(replicas):
            serial += 1
            sent = pod
            if stateful:
                sent = json.loads(json.dumps(pod))
                sent["metadata"].pop("generateName", None)
                sent["metadata"]["name"] = f"{name}-{replica}"
            out.append({"review": _review(sent, f"{session}-{serial:05d}-{rng.randrange(16**8):08x}", rng)})
            out.append({"advance": rng.choice((0.01, 0.2, 1.0))})
        roll = rng.random()
        if roll < 0.35:  # GPUs filled or emptied on one node
            node = rng.choice(sorted(inventories))
            out.append({"node": node, "labels": _labels(inventories[node], contract, rng, rng.random(), per_gpu)})
        elif roll < 0.42:
            out.append({"advance": 400.0})  # every promise expires
        elif roll < 0.47 and step > 10:
            out.append({"remove": "a10-a"})
        if step in (12, 24):  # CPU-only pods ask more, then less: the band turns on, then off
            out.append({"demand": {"cpu": 8000, "device": step == 24, "times": 700 if step == 24 else 400}})
        if session == "pacing" and step % 7 == 6:
            out.append({"pacer": "" if step % 14 == 13 else "the pacer's Lease expired"})
    return out


def replay(session: str, recorded: list[dict[str, Any]]) -> tuple[list[str], dict[str, int]]:
    """The answers to a session's reviews, in order, and how many came from memory."""
    settings = SETTINGS[session]
    clock = Clock()
    view = cluster.ClusterView(settings.contract, default_gpu_memory_mib=settings.default_gpu_memory_mib, clock=clock)
    answers = repeats.RepeatAnswers()
    out: list[str] = []
    for event in recorded:
        if "node" in event:
            view.update_node(event["node"], event["labels"])
        elif "remove" in event:
            view.remove_node(event["remove"])
        elif "pacer" in event:
            view.set_pacer(event["pacer"])
        elif "demand" in event:
            demand = event["demand"]
            for _ in range(demand["times"]):
                view.cpu_demand.note(demand["cpu"], device=demand["device"])
        elif "advance" in event:
            clock.now += event["advance"]
        else:
            _, encoded = answers.review(event["review"].encode(), settings=settings, cluster=view)
            out.append(encoded.decode())
    return out, {"repeats": answers.repeats, "by_fields": answers.by_fields}


def load() -> dict[str, Any]:
    with gzip.open(CORPUS, "rt", encoding="utf-8") as file:
        return json.load(file)  # type: ignore[no-any-return]


def record() -> dict[str, Any]:
    corpus: dict[str, Any] = {"sessions": []}
    for seed, session in enumerate(SETTINGS):
        recorded = events(session, 3600 + seed)
        answers, counts = replay(session, recorded)
        corpus["sessions"].append({"settings": session, "events": recorded, "answers": answers, "counts": counts})
    return corpus


def main() -> None:
    corpus = record()
    CORPUS.parent.mkdir(exist_ok=True)
    with gzip.GzipFile(CORPUS, "wb", mtime=0) as file:  # mtime 0: the same corpus, the same bytes
        file.write(json.dumps(corpus, sort_keys=True, separators=(",", ":")).encode())
    for session in corpus["sessions"]:
        print(session["settings"], len(session["answers"]), "reviews", session["counts"])
    print(CORPUS, CORPUS.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
