"""The typed decode of the fields the webhook reads (webhook/decoding.py) gives the answer the whole
body decoded by orjson gives: generated pods and bodies are answered alike both ways, and what the
fast pass cannot promise (wrong types, invalid UTF-8, numbers orjson reads otherwise) goes to the
whole decode."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
import test_admission_fuzz as fuzz
import test_mutation as kit
from hypothesis import given
from hypothesis import strategies as st

from gpuslice import config, podrequests
from gpuslice.webhook import admission, cpupods, decoding, pods


def answer(body: bytes | str, settings: config.Config = kit.SETTINGS) -> Any:
    """The response, or the malformed review's message (a dry run: the view takes no promise)."""
    try:
        return admission.review(body, settings=settings, cluster=fuzz.VIEWS[False]).response
    except admission.MalformedReview as exc:
        return f"malformed: {exc}"


def both_ways(review: dict[str, Any], settings: config.Config = kit.SETTINGS) -> tuple[Any, Any]:
    """(the answer to the body as bytes, decoded here, and as text, which orjson decodes whole)."""
    body = json.dumps(review)
    return answer(body.encode(), settings), answer(body, settings)


@fuzz.FUZZ
@given(pod=fuzz.pods(), settings_=fuzz.SETTINGS)
def test_generated_pods_get_the_answer_the_whole_decode_gives(pod: dict[str, Any], settings_: config.Config) -> None:
    fast, whole = both_ways(fuzz.review_of(pod, dryRun=True), settings_)
    assert fast == whole


@fuzz.FUZZ
@given(pod=fuzz.POD_LIKE)
def test_oddly_shaped_pods_get_the_answer_or_the_message_the_whole_decode_gives(pod: Any) -> None:
    fast, whole = both_ways(fuzz.review_of(pod, dryRun=True))
    assert fast == whole


BIG = 10**30  # orjson reads it as a float; msgspec as an int (which orjson.dumps refuses)


@pytest.mark.parametrize(
    "where",
    [
        pytest.param(
            lambda pod: pod["spec"]["containers"][0]["resources"]["requests"].update(cpu=BIG), id="cpu-request"
        ),
        pytest.param(
            lambda pod: pod["spec"]["containers"][0]["resources"]["limits"].update({"nvidia.com/gpu": BIG}),
            id="gpu-limit",
        ),
        pytest.param(lambda pod: pod["metadata"]["annotations"].update({"gpu-fraction": BIG}), id="annotation"),
        pytest.param(
            lambda pod: pod["spec"].update(tolerations=[{"key": "k", "tolerationSeconds": BIG}]), id="toleration"
        ),
    ],
)
def test_integers_beyond_64_bits_in_fields_read_are_read_as_orjson_reads_them(where: Any) -> None:
    pod = kit.deployment_pod(
        {"gpu-fraction": "0.5"},
        containers=[kit.container(requests={"cpu": "1"}, limits={"nvidia.com/gpu": "1"})],
    )
    where(pod)
    fast, whole = both_ways(fuzz.review_of(pod, dryRun=True))
    assert fast == whole


def test_fields_the_webhook_does_not_read_are_left_out() -> None:
    pod = kit.deployment_pod({"gpu-fraction": "0.5"}, containers=[kit.container(limits={"nvidia.com/gpu": "1"})])
    pod["spec"]["containers"][0]["env"] = [{"name": "A", "value": "b"}]
    pod["spec"]["volumes"] = [{"name": "data"}]
    decoded = decoding.fields(json.dumps(fuzz.review_of(pod, userInfo={"username": "x"})).encode())
    assert decoded is not None
    read = decoded.document()
    assert read is not None
    document, shaped = read
    assert shaped
    assert "userInfo" not in document["request"] and "kind" not in document["request"]
    assert "volumes" not in document["request"]["object"]["spec"]
    assert set(document["request"]["object"]["spec"]["containers"][0]) == {"name", "resources"}
    assert document["request"]["object"]["metadata"]["annotations"] == {"gpu-fraction": "0.5"}


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b'{"kind":"AdmissionReview","request":{"object":{"spec":"a string"}}}', id="wrong-type"),
        pytest.param(b'{"kind":"AdmissionReview","request":{"object":{"spec":{"containers":[5]}}}}', id="wrong-item"),
        pytest.param(b'{"kind":"AdmissionReview","request":{"userInfo":"\xff"}}', id="not-utf-8-where-skipped"),
        pytest.param(b'{"kind":"AdmissionReview","request":{"uid":"\xed\xa0\x80"}}', id="not-utf-8-where-read"),
        pytest.param(b'{"kind":"AdmissionReview",}', id="not-json"),
        pytest.param(b"[1, 2]", id="not-an-object"),
        pytest.param(b'{"a":' + b"[" * 1100 + b"]" * 1100 + b"}", id="deep"),
    ],
)
def test_what_the_typed_pass_cannot_promise_goes_to_the_whole_decode(body: bytes) -> None:
    assert decoding.fields(body) is None


@given(body=st.binary(max_size=64) | st.builds(lambda v: json.dumps(v).encode(), fuzz.JSON))
def test_any_body_is_decoded_to_an_object_or_left_to_the_whole_decode(body: bytes) -> None:
    decoded = decoding.fields(body)
    read = decoded.document() if decoded is not None else None
    assert decoded is None or (read is not None and isinstance(read[0], dict))


def _pod() -> dict[str, Any]:
    return kit.deployment_pod({"gpu-fraction": "0.5"}, containers=[kit.container(limits={"nvidia.com/gpu": "1"})])


@pytest.mark.parametrize(
    ("where", "words"),
    [
        (lambda p: p["metadata"]["annotations"].update(note=5), "object.metadata.annotations['note'] must be"),
        (lambda p: p["metadata"].update(ownerReferences=[{"kind": 5}]), "object.metadata.ownerReferences[0].kind"),
        (lambda p: p["spec"]["containers"][0].update(name=["a"]), "object.spec.containers[0].name"),
        (lambda p: p["spec"]["containers"][0]["resources"].update(limits="1"), "containers[0].resources.limits"),
        (lambda p: p["spec"]["containers"][0]["resources"].update(claims=[1]), "containers[0].resources.claims[0]"),
        (lambda p: p["spec"].update(affinity={"nodeAffinity": []}), "object.spec.affinity.nodeAffinity"),
        (lambda p: p["spec"].update(resourceClaims=[{"name": 1}]), "object.spec.resourceClaims[0].name"),
        (lambda p: p["spec"].update(tolerations=["x"]), "object.spec.tolerations[0]"),
        (lambda p: p["spec"].update(nodeSelector={"a": True}), "object.spec.nodeSelector['a']"),
    ],
    ids=["annotation", "owner", "name", "limits", "claims", "affinity", "resource-claims", "toleration", "selector"],
)
def test_a_field_of_the_wrong_type_is_refused_with_the_message_of_the_whole_decode(where: Any, words: str) -> None:
    pod = _pod()
    where(pod)
    fast, whole = both_ways(fuzz.review_of(pod))
    assert fast == whole
    assert isinstance(fast, str) and words in fast, fast


def test_the_pod_types_are_reported_checked_only_when_the_parts_kept_whole_pass_too() -> None:
    pod = _pod()

    def shaped() -> bool | None:
        decoded = decoding.fields(json.dumps(fuzz.review_of(pod)).encode())
        read = decoded.document() if decoded is not None else None
        return read[1] if read is not None else None

    assert shaped() is True
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": "x"}}
    assert shaped() is False


@pytest.mark.parametrize("depth", [1000, 1030, 5000])
def test_nesting_in_a_field_not_read_is_refused_where_orjson_refuses_it(depth: int) -> None:
    pod = _pod()
    pod["spec"]["containers"][0]["env"] = "@"  # replaced below by the nested lists
    review = json.dumps(fuzz.review_of(pod, dryRun=True)).replace('"@"', "[" * depth + "]" * depth)
    fast, whole = answer(review.encode()), answer(review)
    assert fast == whole
    assert isinstance(whole, str) == (depth > 1020), whole  # a few levels are the review's own


def test_the_answer_key_leaves_out_what_no_answer_reads() -> None:
    def key(uid: str, name: str, labels: dict[str, str]) -> bytes | None:
        pod = kit.deployment_pod({"gpu-fraction": "0.5"}, containers=[kit.container(limits={"nvidia.com/gpu": "1"})])
        pod["metadata"].update(name=name, labels=labels)
        decoded = decoding.fields(
            json.dumps(fuzz.review_of(pod, uid=uid)).encode(), rules=decoding.KeyRules(labels_read=("read",))
        )
        read = decoded.document() if decoded is not None else None
        assert decoded is not None and read is not None and decoded.uid == uid
        assert read[0]["request"]["uid"] == uid  # the document keeps what the key leaves out
        assert read[0]["request"]["object"]["metadata"]["name"] == name
        assert read[0]["request"]["object"]["metadata"]["labels"] == labels
        return decoded.key

    first = key("u-1", "a", {"app": "x", "read": "off"})
    assert first is not None and first == key("u-2", "b", {"app": "y", "read": "off"})
    assert first != key("u-3", "a", {"app": "x"}) and first != key("u-4", "a", {"app": "x", "read": "on"})


def test_what_the_scheduler_counts_is_read_and_keyed_sidecars_pod_level_requests_and_overhead() -> None:
    def decoded(sidecar: bool, pod_level: str | None) -> tuple[dict[str, Any], bytes | None]:
        main = kit.container(requests={"cpu": "2"}, limits={"nvidia.com/gpu": "1"})
        proxy = kit.container("proxy", requests={"cpu": "1"})
        if sidecar:
            proxy["restartPolicy"] = "Always"
        pod = kit.deployment_pod({"gpu-fraction": "0.5"}, containers=[main])
        pod["spec"]["initContainers"] = [proxy]
        pod["spec"]["overhead"] = {"cpu": "100m"}
        if pod_level is not None:
            pod["spec"]["resources"] = {"requests": {"cpu": pod_level}}
        result = decoding.fields(json.dumps(fuzz.review_of(pod)).encode())
        assert result is not None
        return result.document()[0]["request"]["object"]["spec"], result.key

    spec, key = decoded(True, None)
    assert pods.requests(spec) == (3100, 0)  # main + proxy + overhead
    plain_spec, plain_key = decoded(False, None)
    assert pods.requests(plain_spec) == (2100, 0) and plain_key != key
    sized_spec, sized_key = decoded(True, "6")
    assert pods.requests(sized_spec) == (6100, 0) and sized_key not in (key, plain_key)


@fuzz.FUZZ
@given(pod=fuzz.pods())
def test_what_a_pod_requests_reads_the_same_without_the_document(pod: dict[str, Any]) -> None:
    """A CPU pod answered by its key counts its CPU from the decoded fields (webhook/cpudemand.py)."""
    result = decoding.fields(json.dumps(fuzz.review_of(pod)).encode())
    if result is None:
        return
    spec = result.document()[0]["request"]["object"].get("spec") or {}
    assert pods.requests(result.requests_spec()) == pods.requests(spec)
    assert cpupods.cpu_asked(result) == pods.requests(spec)[0]  # by the containers alone where they say it all
    # ... and the containers-only shortcut of pods.requests counts as the full rule does.
    counted = podrequests.new_pod(spec, pods._container_requests, pods._read, {"cpu", "memory"})
    assert pods.requests(spec) == (counted.get("cpu", 0), counted.get("memory", 0))
    assert pods.cpu_requested(spec) == counted.get("cpu", 0)  # ... and the memo-less count of the CPU


def test_a_body_deeper_than_orjson_reads_goes_to_the_whole_decode_with_a_raised_recursion_limit() -> None:
    deep = b'{"a":' + b"[" * 1100 + b"]" * 1100 + b"}"
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(5000)  # msgspec would now read it; orjson refuses it
    try:
        assert decoding.fields(deep) is None
    finally:
        sys.setrecursionlimit(limit)
