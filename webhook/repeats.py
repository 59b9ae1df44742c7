"""Answers to AdmissionReviews that ask what one already answered asked, but for the request's uid.

Two memories, one answer:
- **By the body's bytes.** The replicas of a Deployment or a Job reach the webhook as the same
  bytes: the pod object is the controller's template (a generated name is chosen after admission)
  and only `request.uid` differs (on the real API server 10 of a Deployment's 12 replicas were
  answered from memory, tests/e2e/test_real_webhook.py). A repeat is answered without decoding.
- **By the fields read.** Pods of one template that differ in what the webhook skips (the one-pod
  Jobs of a CronJob, a StatefulSet's pods, the Deployments of one chart: names, labels, owner
  uids, images, env) are told apart by `decoding.Decoded.key`, the fields the answer depends on,
  after the typed decode and before the review.
Each is remembered the second time it comes: most bodies never repeat, and remembering each at
once would cost every such admission more than a repeat saves (docs/benchmarks.md).

A remembered answer holds while everything its review read of the cluster comes out the same,
and all it reads goes through one seam (`ClusterView.inputs`, webhook/answerinputs.py), which
sorts each read into one of two kinds: the view's shape (`Inputs.shape_generation`: the GPU
classes, MIG profiles and the pacer, which also moves when a pacer comes or goes: a pod gated for
a pacer that died is not answered again), and decisions that free capacity, promises, an owner's
class or the CPU admitted can change (`Inputs.decided`: the GPU class chosen, the CPU-pod band),
recorded while the answer is first computed and taken again for every repeat. The answer is a
function of the fields read, the configuration, the view's shape and those decisions, so it is
then what a full review would give. Free capacity moves with every allocation, on some node every
few seconds in a busy cluster: answers outlive it, their decisions taken again. An entry keeps one
answer per outcome of its decisions: as a burst's promises fill one class and then the next, its
pods' answers alternate between a few, each given from memory. A repeat of a converted pod promises its units
like the first did. DRA conversions (they create claim templates) and malformed reviews are never
remembered.

Cutting the uid out is exact, not a guess at JSON's structure: an answer is given again only when
the first body's request uid was its first `"uid":"` value, occurs nowhere else in it (checked at
the first repeat: bodies that never repeat are not scanned) and has no character that JSON would
escape; a later body with the same bytes around a uid of that form is then the same review for
that uid.

Bodies are told apart by a fingerprint: a small body whole, a larger one by its length and a few
windows of its bytes (about 1 µs, where hashing a 15 KB body costs 7-10; docs/benchmarks.md). The
bytes are compared in full (`startswith`, `endswith`: no copy) before an answer is given again,
so two bodies with one fingerprint only cost time: the second is remembered at its first
sighting, in place of the first.

May import orjson, gpuslice.config and the webhook's admission, answerinputs, cluster,
conversions, cpupods and decoding modules.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import orjson

from gpuslice import config
from gpuslice.webhook import admission, answerinputs, conversions, cpupods, decoding
from gpuslice.webhook import cluster as cluster_

__all__ = ["RepeatAnswers"]

_UID_FIELD = b'"uid":"'
# A uid that needs no escaping in JSON and none in the answer (Kubernetes sends UUIDs).
_PLAIN_UID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")
_PLAIN_UID_TEXT = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# Bodies larger than this are answered in full every time: a pod template is 5-20 KB.
MAX_BODY_BYTES = 64 * 1024
MAX_TOTAL_BYTES = 4 * 1024 * 1024
MAX_SEEN_ONCE = 4096


@dataclasses.dataclass
class _Answer:
    head: bytes  # the encoded answer up to the uid's value
    tail: bytes  # ... and after it
    result: admission.Result  # as first given (its uid is that request's)
    checked: bool = False  # that request's uid occurs nowhere else in its body (checked at first use)


@dataclasses.dataclass
class _Remembered:
    """The answers to one body (or field key) at one shape of the view (`generation`:
    `answerinputs.Inputs.shape_generation`), by what its decisions came to."""

    head: bytes  # the body up to its uid's value (for a field key: the key)
    tail: bytes  # ... and after it
    generation: int
    decide: tuple[Callable[[], Hashable], ...]  # the decisions recorded (Inputs.decided), to take again
    answers: dict[tuple[Hashable, ...], _Answer]
    owner: str = ""  # a body's pod's controller (its class follows it): the same for every repeat of the bytes

    @functools.cached_property
    def reads_owner(self) -> bool:
        """A decision reads the pod's owner (`answerinputs.Inputs.owner`: one class per controller)."""
        return any(getattr(again, "reads_owner", False) for again in self.decide)

    def holds(self, body: bytes, start: int, end: int) -> bool:
        """`body`, its uid's value at [start, end), is this body but for the uid."""
        return (
            start == len(self.head)
            and len(body) - end == len(self.tail)
            and body.startswith(self.head)
            and body.endswith(self.tail)
        )

    def decisions(self, inputs: answerinputs.Inputs) -> tuple[Hashable, ...] | None:
        """What the decisions come to now; None when the view's shape has changed since."""
        if self.generation != inputs.shape_generation:
            return None
        decide = self.decide
        if len(decide) <= 1:  # most answers: none, or the GPU class (a comprehension costs more)
            return (decide[0](),) if decide else ()
        return tuple([again() for again in decide])

    def answer(self, inputs: answerinputs.Inputs) -> _Answer | None:
        decided = self.decisions(inputs)
        return None if decided is None else self.answers.get(decided)

    @property
    def size(self) -> int:
        return len(self.head) + len(self.tail) + sum(len(a.head) + len(a.tail) for a in self.answers.values())


def _uid_span(body: bytes) -> tuple[int, int] | None:
    """Where the first `"uid":"` value is, or None when there is none usable."""
    start = body.find(_UID_FIELD)
    if start < 0:
        return None
    start += len(_UID_FIELD)
    end = body.find(b'"', start)
    if end < 0 or not _PLAIN_UID.fullmatch(body, start, end):
        return None
    return start, end


# Bodies up to this size are fingerprinted whole; larger ones by windows of their bytes.
_WHOLE_BYTES = 2048
_WINDOW = 128


def _fingerprint(body: bytes, start: int, end: int) -> int:
    """A hash of the body but for the bytes in [start, end) (the uid): of it whole when small, else
    of its length, the bytes before the uid, two windows after it (the request's fields, the
    pod's names), two at a third and two thirds of the rest, and the last. Written out, not
    built in a loop: this runs for every admission (a comprehension cost it a microsecond more)."""
    if len(body) <= _WHOLE_BYTES:
        return hash((body[:start], body[end:]))
    rest = len(body) - end
    third = end + rest // 3
    two_thirds = third + rest // 3
    return hash(
        (
            rest,
            body[:start],
            body[end : end + 2 * _WINDOW],
            body[third : third + _WINDOW],
            body[two_thirds : two_thirds + _WINDOW],
            body[-_WINDOW:],
        )
    )


class _Memory(collections.OrderedDict[Hashable, "_Remembered"]):
    """Remembered answers by key, the least recently used forgotten first past `max_bytes`."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__()
        self.max_bytes = max_bytes
        self.bytes = 0

    def keep(self, key: Hashable, entry: _Remembered, decided: tuple[Hashable, ...], answer: _Answer) -> None:
        old = self.pop(key, None)
        if old is not None:
            self.bytes -= old.size
        entry.answers[decided] = answer
        self[key] = entry
        self.bytes += entry.size
        while self.bytes > self.max_bytes and self:
            _, dropped = self.popitem(last=False)
            self.bytes -= dropped.size

    def forget(self, key: Hashable) -> None:
        entry = self.pop(key, None)
        if entry is not None:
            self.bytes -= entry.size


class RepeatAnswers:
    """`review` with the answers to recent distinct bodies and field sets remembered, the least
    recently used forgotten first (at most `max_total_bytes` in all)."""

    def __init__(self, *, max_total_bytes: int = MAX_TOTAL_BYTES) -> None:
        # Field keys are a few hundred bytes, bodies 5-20 KB: a quarter holds thousands of keys.
        self._fields = _Memory(max_total_bytes // 4)  # by decoding.Decoded.key
        self._bodies = _Memory(max_total_bytes - self._fields.max_bytes)  # by fingerprint
        # Fingerprints of bodies answered once, oldest first; and hashes of field keys. Ordered
        # dicts: a plain dict whose oldest key is deleted again and again makes finding the next
        # oldest a scan past the deleted slots (some µs per admission once full).
        self._seen_once: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._keys_seen_once: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._key_rules: decoding.KeyRules | None = None
        self.repeats = 0  # answers given from memory (the metrics read it)
        self.by_fields = 0  # ... of them, those found by the decoded fields (the body was new)

    def __len__(self) -> int:
        """Bodies remembered."""
        return len(self._bodies)

    @property
    def bytes_held(self) -> int:
        """Bytes of the remembered bodies, keys and answers (at most `max_total_bytes`)."""
        return self._bodies.bytes + self._fields.bytes

    def review(
        self, body: bytes, *, settings: config.Config, cluster: cluster_.ClusterView
    ) -> tuple[admission.Result, bytes]:
        """`admission.review(body)` and its answer encoded; MalformedReview as it raises."""
        inputs = cluster.inputs  # all an answer reads of the view, and what a repeat must check
        span = _uid_span(body) if len(body) <= MAX_BODY_BYTES else None
        print_: int | None = None
        if span is not None:
            start, end = span
            print_ = _fingerprint(body, start, end)
            known = self._bodies.get(print_)
            if known is not None and known.holds(body, start, end):
                inputs.owner = known.owner
                answer = known.answer(inputs)
                if answer is not None and (answer.checked or self._check(print_, known, answer)):
                    self._bodies.move_to_end(print_)
                    return self._again(answer, body[start:end].decode(), cluster)
            elif known is None and _first_sighting(self._seen_once, print_):
                # Most bodies never repeat (bare pods, one-pod jobs): remembering each would cost
                # every such admission more than a repeat saves (docs/benchmarks.md), so a body is
                # remembered the second time it comes; so are the fields read (below).
                print_ = None
        decoded = decoding.fields(body, rules=self._rules(settings))
        uid = decoded.uid if decoded is not None else None
        if decoded is None or uid is None or not _PLAIN_UID_TEXT.fullmatch(uid):
            return _reviewed(body, settings, cluster, decoded)  # reviewed (or refused) in full
        key = decoded.key
        keyed = self._fields.get(key) if key is not None else None
        if keyed is None and key is not None and _first_sighting(self._keys_seen_once, hash(key)):
            key = None
        if keyed is not None and key is not None:
            # only a decision taken again reads the owner (a class choice); the promise notes its class
            inputs.owner = decoded.owner if keyed.reads_owner else ""
            decided = keyed.decisions(inputs)
            answer = keyed.answers.get(decided) if decided is not None else None
            if decided is not None and answer is not None:
                self._fields.move_to_end(key)
                self.by_fields += 1
                if print_ is not None and span is not None:
                    self._keep_body(print_, body, span, uid, keyed, decided, answer, decoded)
                outcome = answer.result.outcome
                steered = outcome is not None and outcome.kind == conversions.KIND_CPU_POD
                return self._again(answer, uid, cluster, cpupods.cpu_asked(decoded) if steered else None)
        document = decoded.document()
        generation = inputs.shape_generation
        reads = inputs.start_recording()
        try:
            result = admission.review_document(*document, settings=settings, cluster=cluster)
        finally:
            inputs.stop_recording()
        encoded = orjson.dumps(result.response)
        if _rememberable(uid, result) and (key is not None or print_ is not None):
            decide, decided = tuple([again for again, _ in reads]), tuple([value for _, value in reads])
            if keyed is None or keyed.generation != generation or len(keyed.decide) != len(decide):
                keyed = _Remembered(key or b"", b"", generation, decide, {})  # the key as head: counted in size
            answer = _Answer(*_around(encoded, uid.encode()), _kept(result), checked=True)
            if key is not None:
                self._fields.keep(key, keyed, decided, answer)
            if print_ is not None and span is not None:
                self._keep_body(print_, body, span, uid, keyed, decided, answer, decoded)
        return result, encoded

    def _again(
        self, answer: _Answer, uid: str, cluster: cluster_.ClusterView, pod_cpu_milli: int | None = None
    ) -> tuple[admission.Result, bytes]:
        """A remembered answer given for request `uid`: it promises its units like the first did
        (and counts the pod's CPU, `pod_cpu_milli` where it may differ from the first's)."""
        self.repeats += 1
        admission.promise(answer.result, cluster, pod_cpu_milli=pod_cpu_milli)
        return _for_uid(answer.result, uid), answer.head + uid.encode() + answer.tail

    def _keep_body(
        self,
        print_: int,
        body: bytes,
        span: tuple[int, int],
        uid: str,
        keyed: _Remembered,
        decided: tuple[Hashable, ...],
        answer: _Answer,
        decoded: decoding.Decoded,
    ) -> None:
        """Remember `answer` for the body's bytes too (when the cut is the request's uid), so that
        its next repeat is answered without decoding; `_check` makes sure of the cut at the first."""
        start, end = span
        if body[start:end] != uid.encode():
            return
        known = self._bodies.get(print_)
        if known is None or not known.holds(body, start, end) or known.generation != keyed.generation:
            owner = decoded.owner if keyed.reads_owner else ""  # only a decision taken again reads it
            known = _Remembered(body[:start], body[end:], keyed.generation, keyed.decide, {}, owner)
        if len(known.decide) == len(decided):
            self._bodies.keep(print_, known, decided, dataclasses.replace(answer, checked=False))

    def _rules(self, settings: config.Config) -> decoding.KeyRules:
        if self._key_rules is None:
            self._key_rules = cpupods.key_rules(settings.contract)
        return self._key_rules

    def _check(self, print_: int, known: _Remembered, answer: _Answer) -> bool:
        """Whether the first request's uid occurs in its body only where it was cut out (so the
        cut was `request.uid`); checked once, at the first repeat, as most bodies never repeat.
        A body that fails is forgotten."""
        first = str(answer.result.response["response"]["uid"]).encode()
        if first in known.head + known.tail:
            self._bodies.forget(print_)
            return False
        answer.checked = True
        return True


def _first_sighting(seen: collections.OrderedDict[int, None], print_: int) -> bool:
    """True the first time `print_` comes (the last MAX_SEEN_ONCE are kept in `seen`)."""
    if print_ in seen:
        del seen[print_]
        return False
    seen[print_] = None
    if len(seen) > MAX_SEEN_ONCE:
        seen.popitem(last=False)
    return True


def _reviewed(
    body: bytes, settings: config.Config, cluster: cluster_.ClusterView, decoded: decoding.Decoded | None = None
) -> tuple[admission.Result, bytes]:
    """A full review, nothing remembered (of the typed pass's document where there is one)."""
    if decoded is None:
        result = admission.review(body, settings=settings, cluster=cluster)
    else:
        result = admission.review_document(*decoded.document(), settings=settings, cluster=cluster)
    return result, orjson.dumps(result.response)


def _rememberable(uid: str, result: admission.Result) -> bool:
    """The answer is for request `uid` and needs nothing but the fields, the view and its
    decisions (a DRA conversion creates a claim template)."""
    answered = result.response.get("response") or {}
    if answered.get("uid") != uid:
        return False
    return result.outcome is None or not result.outcome.objects


def _around(encoded: bytes, uid: bytes) -> tuple[bytes, bytes]:
    """The encoded answer before and after its uid (the first `"uid":"` value: `_answer` puts
    `response.uid` first, after apiVersion and kind)."""
    start = encoded.index(_UID_FIELD) + len(_UID_FIELD)
    end = start + len(uid)
    assert encoded[start:end] == uid, "the answer's first uid is the request's"
    return encoded[:start], encoded[end:]


def _kept(result: admission.Result) -> admission.Result:
    """`result` without its patch as objects (the encoded answer has it): the many small dicts of
    a patch, kept for every remembered body, would each be walked by the garbage collector."""
    outcome = result.outcome
    if outcome is None or not outcome.patch:
        return result
    kept = dataclasses.replace(outcome, patch=[], objects=())
    return admission.Result(result.response, result.result, kept, result.dry_run)


def _for_uid(result: admission.Result, uid: str) -> admission.Result:
    response: Mapping[str, Any] = result.response
    answered = {**response, "response": {**response["response"], "uid": uid}}
    return admission.Result(answered, result.result, result.outcome, result.dry_run)
