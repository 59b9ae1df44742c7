"""Answers to AdmissionReviews that repeat one already answered, but for the request's uid.

The replicas of a Deployment or a Job reach the webhook as the same bytes: the pod object is the
controller's template (a generated name is chosen after admission) and only `request.uid` differs
(on the real API server 10 of a Deployment's 12 replicas were answered from memory,
tests/e2e/test_real_webhook.py; a StatefulSet's pods carry their names). A burst is that, so the
webhook remembers its answer per body with the uid cut out (from the second time the body comes)
and, for a repeat, answers without decoding the body again.

A remembered answer holds while the cluster view has not changed (its `generation`, which also
moves when a pacer comes or goes: a pod gated for a pacer that died is not answered again) and every
decision that promises can change (`ClusterView.start_recording`: the GPU class chosen) comes out the
same now; the answer is a function of the body, the configuration, the view's generation and
those decisions, so it is then what a full review would give. A body keeps one answer per outcome
of its decisions: as a burst's promises fill one class and then the next, its pods' answers
alternate between a few, each given from memory. A repeat of a converted pod promises its units
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

May import orjson, gpuslice.config and the webhook's admission, cluster and mutation modules.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import orjson

from gpuslice import config
from gpuslice.webhook import admission, mutation
from gpuslice.webhook import cluster as cluster_

__all__ = ["RepeatAnswers"]

_UID_FIELD = b'"uid":"'
# A uid that needs no escaping in JSON and none in the answer (Kubernetes sends UUIDs).
_PLAIN_UID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")
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
    """The answers to one body at one generation of the view, by what its decisions came to."""

    head: bytes  # the body up to its uid's value
    tail: bytes  # ... and after it
    generation: int
    decide: tuple[Callable[[], Hashable], ...]  # the decisions promises can change, to take again
    answers: dict[tuple[Hashable, ...], _Answer]

    def holds(self, body: bytes, start: int, end: int) -> bool:
        """`body`, its uid's value at [start, end), is this body but for the uid."""
        return (
            start == len(self.head)
            and len(body) - end == len(self.tail)
            and body.startswith(self.head)
            and body.endswith(self.tail)
        )

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
    pod's names), three spread over the rest, and the last."""
    if len(body) <= _WHOLE_BYTES:
        return hash((body[:start], body[end:]))
    rest = len(body) - end
    spread = [end + rest * part // 4 for part in (1, 2, 3)]
    return hash(
        (
            rest,
            body[:start],
            body[end : end + 2 * _WINDOW],
            *[body[at : at + _WINDOW] for at in spread],
            body[-_WINDOW:],
        )
    )


class RepeatAnswers:
    """`review` with the answers to recent distinct bodies remembered, the least recently used
    forgotten first (at most MAX_TOTAL_BYTES)."""

    def __init__(self, *, max_total_bytes: int = MAX_TOTAL_BYTES) -> None:
        self._answers: collections.OrderedDict[int, _Remembered] = collections.OrderedDict()  # by fingerprint
        self._seen_once: dict[int, None] = {}  # fingerprints of bodies answered once, oldest first
        self._bytes = 0
        self._max_bytes = max_total_bytes
        self.repeats = 0  # answers given from memory (the metrics read it)

    def __len__(self) -> int:
        return len(self._answers)

    @property
    def bytes_held(self) -> int:
        """Bytes of the remembered bodies and answers (at most `max_total_bytes`)."""
        return self._bytes

    def review(
        self, body: bytes, *, settings: config.Config, cluster: cluster_.ClusterView
    ) -> tuple[admission.Result, bytes]:
        """`admission.review(body)` and its answer encoded; MalformedReview as it raises."""
        span = _uid_span(body) if len(body) <= MAX_BODY_BYTES else None
        if span is None:
            return _reviewed(body, settings, cluster)
        start, end = span
        print_ = _fingerprint(body, start, end)
        known = self._answers.get(print_)
        if known is not None and not known.holds(body, start, end):
            known = None  # another body with the same fingerprint: this one takes its place below
        elif known is not None and known.generation == cluster.generation:
            decided = tuple(again() for again in known.decide)
            answer = known.answers.get(decided)
            if answer is not None:
                if answer.checked or self._check(print_, known, answer):
                    self._answers.move_to_end(print_)
                    self.repeats += 1
                    admission.promise(answer.result, cluster)
                    uid = body[start:end]
                    return _for_uid(answer.result, uid.decode()), answer.head + uid + answer.tail
                known = None  # `_check` forgot it
        elif known is None and self._first_sighting(print_):
            # Most bodies never repeat (bare pods, one-pod jobs): remembering them would cost every
            # such admission more than a repeat saves (docs/benchmarks.md), so a body is
            # remembered the second time it comes.
            return _reviewed(body, settings, cluster)
        generation = cluster.generation
        reads = cluster.start_recording()
        try:
            result = admission.review(body, settings=settings, cluster=cluster)
        finally:
            cluster.stop_recording()
        encoded = orjson.dumps(result.response)
        uid = body[start:end]
        if _rememberable(uid, result):
            if known is None or known.generation != generation or len(known.decide) != len(reads):
                known = _Remembered(body[:start], body[end:], generation, tuple([again for again, _ in reads]), {})
            answer = _Answer(*_around(encoded, uid), _kept(result))
            self._remember(print_, known, tuple([decided for _, decided in reads]), answer)
        return result, encoded

    def _first_sighting(self, print_: int) -> bool:
        """True the first time a body's fingerprint comes (the last MAX_SEEN_ONCE are kept)."""
        if print_ in self._seen_once:
            del self._seen_once[print_]
            return False
        self._seen_once[print_] = None
        if len(self._seen_once) > MAX_SEEN_ONCE:
            del self._seen_once[next(iter(self._seen_once))]
        return True

    def _check(self, print_: int, known: _Remembered, answer: _Answer) -> bool:
        """Whether the first request's uid occurs in its body only where it was cut out (so the
        cut was `request.uid`); checked once, at the first repeat, as most bodies never repeat.
        A body that fails is forgotten."""
        first = str(answer.result.response["response"]["uid"]).encode()
        if first in known.head + known.tail:
            self._answers.pop(print_)
            self._bytes -= known.size
            return False
        answer.checked = True
        return True

    def _remember(self, print_: int, entry: _Remembered, decided: tuple[Hashable, ...], answer: _Answer) -> None:
        old = self._answers.pop(print_, None)
        if old is not None:
            self._bytes -= old.size
        entry.answers[decided] = answer
        self._answers[print_] = entry
        self._bytes += entry.size
        while self._bytes > self._max_bytes and self._answers:
            _, dropped = self._answers.popitem(last=False)
            self._bytes -= dropped.size


def _reviewed(body: bytes, settings: config.Config, cluster: cluster_.ClusterView) -> tuple[admission.Result, bytes]:
    result = admission.review(body, settings=settings, cluster=cluster)
    return result, orjson.dumps(result.response)


def _rememberable(uid: bytes, result: admission.Result) -> bool:
    """The cut value is the request's uid (`_check` makes sure it is not elsewhere too), and the
    answer needs nothing but the body, the view and its decisions (a DRA conversion creates a
    claim template)."""
    answered = result.response.get("response") or {}
    if answered.get("uid") != uid.decode():
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
    kept = mutation.Outcome(outcome.allowed, [], outcome.message, outcome.decision, outcome.warnings, outcome.kind)
    return admission.Result(result.response, result.result, kept, result.dry_run)


def _for_uid(result: admission.Result, uid: str) -> admission.Result:
    response: Mapping[str, Any] = result.response
    answered = {**response, "response": {**response["response"], "uid": uid}}
    return admission.Result(answered, result.result, result.outcome, result.dry_run)
