"""The webhook's answers to a recorded corpus of admissions (tests/answercorpus.py, recorded before
the steering became objects and the answer cache one seam) are byte for byte what they were, and
as many are given from memory, by bytes and by fields."""

from __future__ import annotations

import answercorpus
import pytest

CORPUS = answercorpus.load()


@pytest.mark.parametrize("session", CORPUS["sessions"], ids=lambda s: s["settings"])
def test_the_recorded_admissions_get_the_recorded_answers(session: dict) -> None:
    answers, counts = answercorpus.replay(session["settings"], session["events"])
    assert len(answers) == len(session["answers"])
    for index, (got, recorded) in enumerate(zip(answers, session["answers"], strict=True)):
        assert got == recorded, f"review {index} of session {session['settings']}"
    assert counts == session["counts"]


def test_the_corpus_covers_repeats_and_the_band() -> None:
    assert sum(len(s["answers"]) for s in CORPUS["sessions"]) > 500
    assert all(s["counts"]["repeats"] > 0 and s["counts"]["by_fields"] > 0 for s in CORPUS["sessions"])
