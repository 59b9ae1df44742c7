"""Kubernetes quantities read exactly (gpuslice/quantity.py): the grammar apimachinery accepts, the
amounts it means, a clear error for everything else, and the MiB conversions callers round with."""

from __future__ import annotations

import decimal
import time
from typing import Any

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st
from kubernetes.utils import quantity as client_quantity

from gpuslice import quantity

D = decimal.Decimal


@pytest.mark.parametrize(
    ("text", "amount", "suffix"),
    [
        ("4", D(4), ""),
        ("0", D(0), ""),
        ("500m", D("0.5"), "m"),
        ("1n", D("1e-9"), "n"),
        ("3u", D("0.000003"), "u"),
        ("2k", D(2000), "k"),
        ("2M", D(2 * 10**6), "M"),
        ("2G", D(2 * 10**9), "G"),
        ("2T", D(2 * 10**12), "T"),
        ("2P", D(2 * 10**15), "P"),
        ("2E", D(2 * 10**18), "E"),  # E alone is exa, not an exponent
        ("1Ki", D(2**10), "Ki"),
        ("16Gi", D(16 * 2**30), "Gi"),
        ("1Ti", D(2**40), "Ti"),
        ("1Pi", D(2**50), "Pi"),
        ("1Ei", D(2**60), "Ei"),
        ("1.5", D("1.5"), ""),
        (".5", D("0.5"), ""),
        ("5.", D(5), ""),
        ("+5", D(5), ""),
        ("-1", D(-1), ""),
        ("-1.5Gi", D("-1.5") * 2**30, "Gi"),
        ("2e3", D(2000), "e3"),
        ("2E3", D(2000), "E3"),
        ("2e+3", D(2000), "e+3"),
        ("25e-1", D("2.5"), "e-1"),
        ("0.1Mi", D("104857.6"), "Mi"),  # exact: no rounding to 28 digits
        ("1234567890123456789012345678901234567890Ki", D(1234567890123456789012345678901234567890 * 1024), "Ki"),
    ],
)
def test_every_form_of_the_grammar_reads_as_its_exact_amount(text: str, amount: decimal.Decimal, suffix: str) -> None:
    read = quantity.read(text)
    assert read.amount == amount and read.suffix == suffix
    assert quantity.parse(text) == amount


@pytest.mark.parametrize(
    ("text", "scaled"),
    [("4", False), ("2e3", False), ("2E3", False), ("2E", True), ("1m", True), ("1Mi", True), ("1k", True)],
)
def test_a_quantity_says_whether_its_suffix_names_a_unit(text: str, scaled: bool) -> None:
    assert quantity.read(text).scaled is scaled


SUFFIXES = ["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]


@given(
    number=st.from_regex(r"[0-9]{1,12}(\.[0-9]{0,6})?", fullmatch=True),
    sign=st.sampled_from(["", "-", "+"]),
    suffix=st.sampled_from(SUFFIXES),
)
@example(number="10000000001", sign="", suffix="Ei")  # beyond 28 digits: left out, not failed
@example(number="999999999999.999999", sign="-", suffix="Ki")
def test_a_quantity_reads_as_the_kubernetes_client_reads_it(number: str, sign: str, suffix: str) -> None:
    """Within the client's 28 digits the two agree exactly (beyond, the client rounds; this does not)."""
    text = sign + number + suffix
    exact = quantity.parse(text)
    significant = "".join(map(str, exact.as_tuple().digits)).strip("0")  # normalize() would round to 28
    assume(len(significant) <= 28)  # "10000000001Ei" has 29: the client rounds it
    assert exact == client_quantity.parse_quantity(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        " 4",
        "4 ",
        "4\n",
        "1_0",  # Decimal() reads these four; Kubernetes does not
        "１２",
        "NaN",
        "Infinity",
        "Ki",
        "m",
        "1ki",
        "1mi",
        "1KB",
        "1KiB",
        "1e",
        "1e+",
        "1e3Mi",  # an exponent and a suffix
        "1Mie3",
        "--1",
        "+-1",
        ".",
        "-.",
        "1.2.3",
        "e3",
        "1,5",
        "0x10",
        "1 Gi",
    ],
)
def test_text_outside_the_grammar_is_refused_naming_it(text: str) -> None:
    with pytest.raises(quantity.QuantityError, match="is not a quantity; accepted: a Kubernetes quantity") as caught:
        quantity.parse(text)
    assert repr(text) in str(caught.value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "'None' is not a string"),
        ([1], r"'\[1\]' is not a string"),
        ({"a": 1}, "is not a string"),
        (D(1), "'1' is not a string"),
        (True, "'True' is a boolean, not a quantity"),
        (float("nan"), "'nan' is not a finite number"),
        (float("inf"), "'inf' is not a finite number"),
        ("1e999999999999999999999999", "has an exponent out of range"),
        ("1e-999999999999999999999999", "has an exponent out of range"),
    ],
)
def test_values_that_are_no_quantity_are_refused_saying_why(value: Any, message: str) -> None:
    with pytest.raises(quantity.QuantityError, match=message):
        quantity.parse(value)


def test_a_long_value_is_quoted_cut_short() -> None:
    with pytest.raises(quantity.QuantityError, match=r"\.\.\. \(500 characters\)"):
        quantity.parse("x" * 500)


def test_an_error_is_a_value_error() -> None:
    assert issubclass(quantity.QuantityError, ValueError)


@pytest.mark.parametrize(
    ("value", "amount"), [(4, D(4)), (-3, D(-3)), (2**70, D(2**70)), (0.5, D("0.5")), (0.1, D("0.1"))]
)
def test_numbers_are_read_as_a_json_number_is_written(value: int | float, amount: decimal.Decimal) -> None:
    assert quantity.parse(value) == amount


@pytest.mark.parametrize(
    ("text", "down", "up"),
    [
        ("1Mi", 1, 1),
        ("1.5Mi", 1, 2),
        ("1048577", 1, 2),  # one byte over a MiB
        ("1", 0, 1),
        ("0", 0, 0),
        ("16Gi", 16384, 16384),
        ("-1.5Mi", -1, -1),  # toward zero, and up toward +infinity
        ("1e-9", 0, 1),
    ],
)
def test_bytes_convert_to_whole_mib_rounding_as_asked(text: str, down: int, up: int) -> None:
    amount = quantity.parse(text)
    assert quantity.mib_down(amount) == down
    assert quantity.mib_up(amount) == up


def test_a_huge_exponent_is_refused_by_comparison_not_expanded() -> None:
    started = time.monotonic()
    for text in ("1e999999999", "-1e999999999", "1e999999999999999999"):
        with pytest.raises(quantity.QuantityError, match="MiB either way"):
            quantity.mib_up(quantity.parse(text))
    assert time.monotonic() - started < 1


def test_the_limit_is_a_callers_own() -> None:
    assert quantity.mib_up(quantity.parse("1Ti"), limit=2**20) == 2**20
    with pytest.raises(quantity.QuantityError):
        quantity.mib_up(quantity.parse("1025Gi"), limit=2**20)


@given(mib=st.integers(0, 2**40))
def test_what_gpuslice_publishes_in_mi_reads_back(mib: int) -> None:
    text = quantity.mebibytes(mib)
    assert quantity.whole_mebibytes(text) == mib
    assert quantity.parse(text) == mib * quantity.MIB


@pytest.mark.parametrize("value", ["1Gi", "1024", "1.5Mi", "-1Mi", "1Mi\n", " 1Mi", "Mi", 1024, None])
def test_any_other_spelling_is_not_whole_mebibytes(value: Any) -> None:
    assert quantity.whole_mebibytes(value) is None
