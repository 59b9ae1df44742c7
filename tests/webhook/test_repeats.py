"""Answers from memory for reviews that repeat one already answered but for the uid: always what a
full review of the same body would give, against the same cluster view and its promises."""

from __future__ import annotations

import base64
import json
import pathlib
from typing import Any

import hypothesis
import orjson
import pytest
import reviewkit
from hypothesis import given
from hypothesis import strategies as st

from gpuslice import config
from gpuslice.node import labels as node_labels
from gpuslice.node import nodefile
from gpuslice.sim import trace
from gpuslice.webhook import admission, cluster, cpudemand, repeats, steering

SETTINGS = config.Config()
EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "gpuslice" / "examples"
H100, H200 = 81559, 143771


def two_class_view() -> cluster.ClusterView:
    """The demo node (2 x H100 80GB) and an 8 x H200 node, all free."""
    view = cluster.ClusterView(SETTINGS.contract, default_gpu_memory_mib=SETTINGS.default_gpu_memory_mib)
    for name, file in (("demo", "demo-node.yaml"), ("h200", "h200x8-node.yaml")):
        view.update_node(name, node_labels.node_labels(nodefile.load(EXAMPLES / file), SETTINGS.contract))
    return view


def one_class_view() -> cluster.ClusterView:
    """An 8 x H200 node only: one class, so promises never change the class chosen."""
    view = cluster.ClusterView(SETTINGS.contract, default_gpu_memory_mib=SETTINGS.default_gpu_memory_mib)
    view.update_node("h200", node_labels.node_labels(nodefile.load(EXAMPLES / "h200x8-node.yaml"), SETTINGS.contract))
    return view


def body(uid: str, annotations: dict[str, str] | None = None, **request: Any) -> bytes:
    """A ReplicaSet's pod CREATE as kube-apiserver sends it (compact JSON, uid first)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "trainer-7c9f8d6b5-",
            "namespace": "team-a",
            "annotations": annotations if annotations is not None else {"gpu-fraction": "0.5"},
            "ownerReferences": [
                {"kind": "ReplicaSet", "name": "trainer-7c9f8d6b5", "uid": "rs-uid", "controller": True}
            ],
        },
        "spec": {
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        },
    }
    review = reviewkit.pod_create(pod, uid=uid, **request)
    return json.dumps(review, separators=(",", ":")).encode()


def full(bodies: list[bytes]) -> tuple[list[bytes], cluster.ClusterView]:
    view = two_class_view()
    return [orjson.dumps(admission.review(b, settings=SETTINGS, cluster=view).response) for b in bodies], view


def remembered(
    bodies: list[bytes], answers: repeats.RepeatAnswers | None = None
) -> tuple[list[bytes], cluster.ClusterView, int]:
    view = two_class_view()
    answers = answers or repeats.RepeatAnswers()
    encoded = []
    for b in bodies:
        result, raw = answers.review(b, settings=SETTINGS, cluster=view)
        assert orjson.loads(raw) == result.response  # the bytes sent and the answer kept agree
        encoded.append(raw)
    return encoded, view, answers.repeats


def test_a_burst_of_replicas_gets_the_answers_of_full_reviews_and_the_same_promises() -> None:
    # 24 replicas of a half-GPU pod that may take any class: the class flips between H200 and H100
    # as promises accumulate, so a remembered answer must be checked against the promises, not just replayed.
    any_class = {"gpu-fraction": "0.5", SETTINGS.contract.gpu_class_annotation: "any"}
    bodies = [body(f"uid-{i:04d}", any_class) for i in range(24)]
    expected, full_view = full(bodies)
    got, view, repeated = remembered(bodies)
    assert got == expected
    assert {json.loads(g)["response"]["uid"] for g in got} == {f"uid-{i:04d}" for i in range(24)}
    for memory in (H100, H200):
        assert view.ledger.promised_units(memory) == full_view.ledger.promised_units(memory) > 0
    assert 12 < repeated < 24  # most answered from memory, not the first of each class choice


def test_a_change_of_the_classes_is_never_answered_from_memory() -> None:
    # A gpu-memory share makes no decision that promises move: only the view's shape tells
    # that a third class, too small for it, now exists, and the pod must be kept off it.
    answers = repeats.RepeatAnswers()
    view = two_class_view()
    share = {"gpu-memory": "20000"}
    for uid in ("m-1", "m-2", "m-3"):  # the second is remembered, the third answered from memory
        answers.review(body(uid, share), settings=SETTINGS, cluster=view)
    assert answers.repeats == 1
    t4 = trace.node_inventory(trace.TraceNode("t4", 96000, 393216, 2, "T4"))
    view.update_node("t4", node_labels.node_labels(t4, SETTINGS.contract))
    _, encoded = answers.review(body("m-4", share), settings=SETTINGS, cluster=view)
    assert answers.repeats == 1
    assert encoded == orjson.dumps(admission.review(body("m-4", share), settings=SETTINGS, cluster=view).response)
    assert b'"response":{"uid":"m-4","allowed":true' in encoded


def allocate(view: cluster.ClusterView, name: str, file: str, allocated: dict[int, int]) -> None:
    """Node `name` (an example node file) relabelled with `allocated` units taken on its GPUs, by index."""
    node = nodefile.load(EXAMPLES / file)
    taken = {g.uuid: allocated.get(i, 0) for i, g in enumerate(node.memory_gpus)}
    view.update_node(name, node_labels.node_labels(node, SETTINGS.contract, allocated=taken))


TENTH = {"gpu-fraction": "0.1"}  # small: promises alone do not move the class in a few pods


def test_answers_outlive_a_change_of_free_capacity_with_their_decisions_taken_again() -> None:
    answers, view, fresh = repeats.RepeatAnswers(), two_class_view(), two_class_view()
    for each in (view, fresh):  # the H100s half used: the H200s have the larger free share
        allocate(each, "demo", "demo-node.yaml", {0: 150, 1: 150})
    for uid in ("f-1", "f-2", "f-3"):  # the second is remembered, the third answered from memory
        answers.review(body(uid, TENTH), settings=SETTINGS, cluster=view)
    assert answers.repeats == 1
    for each in (view, fresh):  # free capacity moves; the classes stay
        allocate(each, "h200", "h200x8-node.yaml", {0: 100})
    _, encoded = answers.review(body("f-4", TENTH), settings=SETTINGS, cluster=view)
    assert answers.repeats == 2
    assert encoded == orjson.dumps(admission.review(body("f-4", TENTH), settings=SETTINGS, cluster=fresh).response)
    # The H200s all but full: the decision comes out otherwise, and so does the answer.
    allocate(view, "h200", "h200x8-node.yaml", dict.fromkeys(range(8), 560))
    allocate(fresh, "h200", "h200x8-node.yaml", dict.fromkeys(range(8), 560))
    _, moved = answers.review(body("f-5", TENTH), settings=SETTINGS, cluster=view)
    assert moved == orjson.dumps(admission.review(body("f-5", TENTH), settings=SETTINGS, cluster=fresh).response)
    assert json.loads(base64.b64decode(json.loads(moved)["response"]["patch"])) != json.loads(
        base64.b64decode(json.loads(encoded)["response"]["patch"])
    )


def test_dry_runs_are_remembered_apart_and_promise_nothing() -> None:
    bodies = [body(f"d-{i}", dryRun=True) for i in range(5)]
    _, view, repeated = remembered(bodies)
    assert repeated == 3  # remembered the second time
    assert view.ledger.promised_units(H100) == view.ledger.promised_units(H200) == 0


@pytest.mark.parametrize(
    "uid",
    [
        "uid-with-\\u0022-escape",  # JSON escapes: the raw bytes are not the value
        "a b",  # not a plain uid
    ],
)
def test_uids_that_are_not_plain_are_answered_in_full(uid: str) -> None:
    raw = body("x").replace(b'"uid":"x"', b'"uid":"' + uid.encode() + b'"')
    expected = admission.review(raw, settings=SETTINGS, cluster=two_class_view()).response["response"]["uid"]
    answers = repeats.RepeatAnswers()
    for _ in range(3):
        result, encoded = answers.review(raw, settings=SETTINGS, cluster=two_class_view())
        assert json.loads(encoded)["response"]["uid"] == expected
    assert answers.repeats == 0


def test_a_body_whose_first_uid_is_not_the_request_uid_is_not_remembered() -> None:
    # The object first, the request uid last: the first "uid":" value is the pod owner's, and only
    # it changes between these bodies. Answered from memory, the third would get the owner's uid.
    def reordered(object_uid: str) -> bytes:
        document = json.loads(body("request-uid"))
        request = document["request"]
        request["object"]["metadata"]["ownerReferences"][0]["uid"] = object_uid
        document["request"] = {"object": request.pop("object"), **request}
        return json.dumps(document, separators=(",", ":")).encode()

    answers = repeats.RepeatAnswers()
    view = cluster.ClusterView(SETTINGS.contract, default_gpu_memory_mib=SETTINGS.default_gpu_memory_mib)
    uids = [
        json.loads(answers.review(reordered(u), settings=SETTINGS, cluster=view)[1])["response"]["uid"]
        for u in ("o1", "o2", "o3")
    ]
    assert uids == ["request-uid"] * 3
    assert answers.repeats == answers.by_fields == 1  # by the decoded request uid, never by the bytes


def test_a_uid_that_occurs_twice_is_not_answered_again() -> None:
    # The request uid is also an annotation's value: cutting out the first would not be exact.
    answers = repeats.RepeatAnswers()
    view = cluster.ClusterView(SETTINGS.contract, default_gpu_memory_mib=SETTINGS.default_gpu_memory_mib)
    raw = body("dup-uid", {"gpu-fraction": "0.5", "note": "dup-uid"})
    for _ in range(3):
        answers.review(raw, settings=SETTINGS, cluster=view)
    assert answers.repeats == answers.by_fields == 1  # by the decoded uid only, never by the bytes
    plain = body("dup-uid", {"gpu-fraction": "0.5", "note": "other"})
    for _ in range(3):
        answers.review(plain, settings=SETTINGS, cluster=view)
    # The same body without the second occurrence is answered by its bytes the third time.
    assert answers.repeats - answers.by_fields == 1


def test_denials_and_cpu_pods_repeat_too_and_malformed_reviews_never_do() -> None:
    denied = [body(f"n-{i}", {"gpu-fraction": "1.5"}) for i in range(3)]
    cpu = [body(f"c-{i}", {}).replace(b',"resources":{"limits":{"nvidia.com/gpu":"1"}}', b"") for i in range(3)]
    expected, _ = full(denied + cpu)
    got, _, repeated = remembered(denied + cpu)
    assert got == expected and repeated == 2  # the third of each
    assert json.loads(got[0])["response"]["allowed"] is False
    answers = repeats.RepeatAnswers()
    for uid in ("m-1", "m-2"):
        with pytest.raises(admission.MalformedReview):
            answers.review(
                body(uid).replace(b'"operation":"CREATE"', b'"operation":7'),
                settings=SETTINGS,
                cluster=two_class_view(),
            )
    assert answers.repeats == 0


def test_memory_stays_within_its_bound() -> None:
    view = one_class_view()
    answers = repeats.RepeatAnswers(max_total_bytes=12_000)
    templates = [body(f"t{i}", {"gpu-fraction": "0.5", "team": "x" * 400 + str(i)}) for i in range(10)]
    for raw in templates:
        for _ in range(2):  # remembered the second time
            answers.review(raw, settings=SETTINGS, cluster=view)
    assert 0 < len(answers) < 10
    assert answers.bytes_held <= 12_000
    # The newest template is still remembered (one class: promises never change the choice), the
    # oldest is not.
    answers.review(templates[-1].replace(b'"uid":"t9"', b'"uid":"t9b"'), settings=SETTINGS, cluster=view)
    answers.review(templates[0].replace(b'"uid":"t0"', b'"uid":"t0b"'), settings=SETTINGS, cluster=view)
    assert answers.repeats == 1


def test_a_body_that_comes_once_is_not_remembered() -> None:
    answers = repeats.RepeatAnswers()
    view = cluster.ClusterView(SETTINGS.contract, default_gpu_memory_mib=SETTINGS.default_gpu_memory_mib)
    for i in range(5):
        answers.review(body(f"once-{i}", {"gpu-fraction": "0.5", "n": str(i)}), settings=SETTINGS, cluster=view)
    assert len(answers) == 0 and answers.repeats == 0


def test_an_answer_remembered_for_one_view_is_not_given_for_another() -> None:
    answers = repeats.RepeatAnswers()
    first, other = one_class_view(), one_class_view()  # alike, but not the same view
    for uid in ("v-1", "v-2"):  # the second is remembered
        answers.review(body(uid), settings=SETTINGS, cluster=first)
    answers.review(body("v-3"), settings=SETTINGS, cluster=first)
    assert answers.repeats == 1  # the view it was remembered for gets it
    answers.review(body("v-4"), settings=SETTINGS, cluster=other)
    assert answers.repeats == 1


def test_large_bodies_that_share_a_fingerprint_get_their_own_answers() -> None:
    # Two 20 KB bodies of one length that differ only between the fingerprint's windows.
    def padded(uid: str, memory: str) -> bytes:
        return body(uid, {"pad-a": "a" * 7_000, "gpu-memory": memory, "pad-b": "b" * 13_000})

    first, second = padded("f-1", "2000"), padded("s-1", "4000")
    assert len(first) == len(second) and first != second.replace(b'"uid":"s-1"', b'"uid":"f-1"')
    start, end = repeats._uid_span(first) or (0, 0)
    assert repeats._fingerprint(first, start, end) == repeats._fingerprint(second, start, end)
    answers, view = repeats.RepeatAnswers(), one_class_view()
    sequence = [padded("f-1", "2000"), padded("f-2", "2000"), padded("s-1", "4000"), padded("s-2", "4000")]
    sequence += [padded("f-3", "2000"), padded("s-3", "4000")]
    for raw in sequence:
        _, encoded = answers.review(raw, settings=SETTINGS, cluster=view)
        assert encoded == orjson.dumps(admission.review(raw, settings=SETTINGS, cluster=one_class_view()).response)
    assert answers.repeats == 1  # s-3: s-2 took f-2's place; f-3 was answered in full


def variant(uid: str, index: int, annotations: dict[str, str] | None = None, **container: Any) -> bytes:
    """A pod of one template that differs from its siblings only in what the webhook skips: name,
    labels, owner uid, image, env (one-pod Jobs of one CronJob, say)."""
    document = json.loads(body(uid, annotations))
    pod = document["request"]["object"]
    pod["metadata"].pop("generateName")
    pod["metadata"]["name"] = f"job-{index}-x7k2p"
    pod["metadata"]["labels"] = {"job-name": f"job-{index}", "controller-uid": f"c-{index}"}
    pod["metadata"]["ownerReferences"][0]["uid"] = f"owner-{index}"
    pod["spec"]["containers"][0].update({"image": f"trainer:{index}", "env": [{"name": "RUN", "value": str(index)}]})
    pod["spec"]["containers"][0].update(container)
    return json.dumps(document, separators=(",", ":")).encode()


def test_pods_that_differ_only_in_what_the_webhook_skips_share_answers() -> None:
    # Every body is new, so none is answered by its bytes; the fields read are one template's.
    bodies = [variant(f"j-{i:04d}", i) for i in range(24)]
    expected, full_view = full(bodies)
    got, view, repeated = remembered(bodies)
    assert got == expected
    for memory in (H100, H200):
        assert view.ledger.promised_units(memory) == full_view.ledger.promised_units(memory) > 0
    assert 12 < repeated < 24  # all but the first of each class choice


def test_a_label_or_field_the_answer_reads_keeps_answers_apart() -> None:
    answers, view = repeats.RepeatAnswers(), one_class_view()
    off = {SETTINGS.contract.label_pod_cpu_steering: "off"}
    cpu = [variant(f"c-{i}", i, {}, resources={}) for i in range(3)]
    opted_out = [
        orjson.dumps(document)
        for i in range(3)
        if (document := json.loads(variant(f"o-{i}", i, {}, resources={})))
        and document["request"]["object"]["metadata"]["labels"].update(off) is None
    ]
    renamed = [variant(f"r-{i}", i, name="other") for i in range(3)]
    for raw in [variant("g-0", 0), *(raw for trio in zip(cpu, opted_out, renamed, strict=True) for raw in trio)]:
        _, encoded = answers.review(raw, settings=SETTINGS, cluster=view)
        assert encoded == orjson.dumps(admission.review(raw, settings=SETTINGS, cluster=one_class_view()).response)
    assert answers.by_fields == 3  # the third of each (remembered at the second): none took another's answer
    steered, left = (
        orjson.loads(answers.review(r, settings=SETTINGS, cluster=view)[1]) for r in (cpu[0], opted_out[0])
    )
    assert "patch" in steered["response"] and "patch" not in left["response"]


def test_pods_without_a_device_share_answers_whatever_their_amounts_and_gpu_pods_do_not() -> None:
    """A CPU pod's answer reads no amount, so CPU pods sized each their own way share it; a GPU
    pod's patch rewrites its resources, amounts included, so each keeps its own (here without
    KAI's placeholder: the annotation alone tells them apart)."""
    answers, view = repeats.RepeatAnswers(), one_class_view()

    def sized(kind: str, i: int) -> bytes:
        annotations = {} if kind == "cpu" else {"gpu-fraction": "0.5"}
        resources = {"requests": {"cpu": f"{100 + i}m", "memory": f"{i + 1}Gi"}}
        return variant(f"{kind}-{i}", i, annotations, resources=resources)

    for kind in ("cpu", "gpu"):
        for i in range(6):
            raw = sized(kind, i)
            _, encoded = answers.review(raw, settings=SETTINGS, cluster=view)
            assert encoded == orjson.dumps(admission.review(raw, settings=SETTINGS, cluster=one_class_view()).response)
        if kind == "cpu":
            assert answers.by_fields == 4  # all but the first two (a key is remembered at its second coming)
    assert answers.by_fields == 4  # no GPU pod took another's answer


def test_a_cpu_pod_answer_remembered_before_the_nearly_full_band_is_not_given_after() -> None:
    """The band (steering.cpuPodsNearlyFullMiB) turns on once CPU-only pods ask enough of the CPU
    admitted: a CPU pod's answer remembered without it is then not given again."""
    answers, view = repeats.RepeatAnswers(), one_class_view()
    raw = [variant(f"c-{i}", i, {}, resources={"requests": {"cpu": "4"}}) for i in range(4)]
    for b in raw[:3]:
        answers.review(b, settings=SETTINGS, cluster=view)
    cpu, total = view.cpu_demand.asked
    assert answers.by_fields == 1 and cpu == total == pytest.approx(12000, rel=1e-3)  # three pods of 4 cores
    for _ in range(cpudemand.MIN_PODS):
        view.cpu_demand.note(4000, device=False)
    result, _ = answers.review(raw[3], settings=SETTINGS, cluster=view)
    assert answers.by_fields == 1  # answered in full
    patch = orjson.loads(base64.b64decode(result.response["response"]["patch"]))
    terms = patch[0]["value"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert terms == steering.cpu_pod_preferences(SETTINGS.contract, SETTINGS.steering.cpu_pods_nearly_full_mib)


# Few variants of each, so that field sets repeat within one sequence and are answered from memory.
_SKIPPED = st.tuples(st.integers(0, 3), st.sampled_from(["", "x" * 50]))  # name/labels/env variant, padding
_READ = st.tuples(
    st.sampled_from([{"gpu-fraction": "0.5"}, {"gpu-memory": "20000"}, {}]),
    st.sampled_from(["main", "other"]),  # container name
    st.sampled_from(
        [
            {"limits": {"nvidia.com/gpu": "1"}},
            {"requests": {"cpu": "2"}},
            {"requests": {"cpu": "3"}},  # another amount: left out of a CPU pod's key only
            {"requests": {"cpu": 3}},  # another JSON type
            {"requests": {"cpu": "2", "example.com/fpga": "1"}},  # a device: the amounts stay in the key
        ]
    ),
    st.sampled_from([False, False, False, True]),  # dry run
)


# Between pods, sometimes: units taken on the first GPU of a node (free capacity moves, the classes stay).
_CAPACITY = st.tuples(st.sampled_from([("demo", "demo-node.yaml"), ("h200", "h200x8-node.yaml")]), st.integers(0, 300))


@hypothesis.settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.tuples(_SKIPPED, _READ), _CAPACITY), min_size=10, max_size=40))
def test_any_sequence_of_pods_gets_the_answers_and_promises_of_full_reviews(
    steps: list[Any],
) -> None:
    """Pods that differ in read and skipped fields, with free capacity moving between them: the
    memory answers as full reviews do, and promises the same units."""
    answers, view, full_view = repeats.RepeatAnswers(), two_class_view(), two_class_view()
    for i, step in enumerate(steps):
        if isinstance(step[0][0], str):  # a capacity change, on both views
            (name, file), units = step
            allocate(view, name, file, {0: units})
            allocate(full_view, name, file, {0: units})
            continue
        (variant_of, pad), (asked, container_name, resources, dry_run) = step
        raw = variant(f"p-{i}", variant_of, {**asked, **({"pad": pad} if pad else {})}, name=container_name)
        document = json.loads(raw)
        document["request"]["dryRun"] = dry_run
        document["request"]["object"]["spec"]["containers"][0]["resources"] = resources
        raw = orjson.dumps(document)
        result, encoded = answers.review(raw, settings=SETTINGS, cluster=view)
        assert orjson.loads(encoded) == result.response  # the bytes sent and the answer kept agree
        assert encoded == orjson.dumps(admission.review(raw, settings=SETTINGS, cluster=full_view).response), i
        for memory in (H100, H200):
            assert view.ledger.promised_units(memory) == full_view.ledger.promised_units(memory)
        assert view.cpu_demand.asked == full_view.cpu_demand.asked  # each pod's own CPU, remembered or not


def test_replicas_of_one_owner_keep_its_class_and_are_answered_from_memory() -> None:
    """One class per owner (webhook/classchoice.py): the promises no longer move the replicas of a
    ReplicaSet from class to class, and its repeats are still answered from memory."""
    bodies = [body(f"uid-{i:04d}") for i in range(24)]
    expected, full_view = full(bodies)
    got, view, repeated = remembered(bodies)
    assert got == expected
    classes = (
        {
            json.loads(json.loads(base64.b64decode(json.loads(g)["response"]["patch"]))[-1]["value"])["classMemoryMiB"]
            for g in got
        }
        if False
        else {m for m in (H100, H200) if view.ledger.promised_units(m)}
    )
    assert len(classes) == 1  # all 24 in the first replica's class
    assert view.ledger.promised_units(classes.pop()) == full_view.ledger.promised_units(
        H200
    ) + full_view.ledger.promised_units(H100)
    assert repeated >= 20


def decided_class(raw: bytes) -> int:
    response = json.loads(raw)["response"]
    ops = json.loads(base64.b64decode(response["patch"]))
    (annotation,) = [op["value"] for op in ops if op["path"].endswith("gpuslice.io~1decision")] or [
        op["value"]["gpuslice.io/decision"] for op in ops if op["path"] == "/metadata/annotations"
    ]
    return int(json.loads(annotation)["classMemoryMiB"])


def test_pods_of_many_owners_of_one_template_share_answers_each_owner_keeping_its_class() -> None:
    """The owner is not part of what an answer is found by (the one-pod Jobs of a CronJob share
    answers): the class choice, taken again for each repeat, reads the owner of the pod at hand."""
    owners = [f"owner-{i}" for i in range(4)]
    bodies = []
    for round_ in range(4):
        for owner in owners:
            document = json.loads(body(f"{owner}-{round_}"))
            document["request"]["object"]["metadata"]["ownerReferences"][0]["uid"] = owner
            bodies.append(json.dumps(document, separators=(",", ":")).encode())
    expected, _ = full(bodies)
    got, _, repeated = remembered(bodies)
    assert got == expected
    for owner in owners:
        mine = {decided_class(raw) for raw, b in zip(got, bodies, strict=True) if f'"uid":"{owner}"'.encode() in b}
        assert len(mine) == 1, (owner, mine)
    assert len({decided_class(raw) for raw in got}) == 2  # the owners do not all go to one class
    assert repeated >= 8
