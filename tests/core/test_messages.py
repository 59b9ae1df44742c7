"""How a refusal quotes the value it refuses (gpuslice/messages.py)."""

from __future__ import annotations

from gpuslice import labelcodec, messages, quantity
from gpuslice.webhook import parsing


def test_a_short_value_is_quoted_whole_and_a_long_one_cut_with_its_length() -> None:
    assert messages.quote("0.5") == "'0.5'"
    assert messages.quote(7) == "'7'"
    long = "9" * 5000
    assert messages.quote(long) == f"{'9' * messages.QUOTE_CHARS!r}... (5000 characters)"
    assert messages.cut("a, b") == "a, b"
    assert messages.cut("x" * 101).endswith("... (101 characters)")


def test_every_parser_quotes_the_same_way() -> None:
    long = "1" * 300 + "Zi"
    refused = []
    for parse in (quantity.parse, lambda v: parsing.memory_mib("gpu-memory", v)):
        try:
            parse(long)
        except ValueError as exc:
            refused.append(str(exc))
    try:
        labelcodec.count_of("gpu.free-units", long)
    except ValueError as exc:
        refused.append(str(exc))
    assert len(refused) == 3
    assert all(messages.quote(long) in message for message in refused), refused
