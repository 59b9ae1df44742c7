"""CPU and memory requests as the class choice reads them: the integer fast path for plain
quantities ("4", "500m", "16Gi") gives what the Kubernetes client's quantity parser gives."""

from __future__ import annotations

import decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils import quantity

from gpuslice.webhook import parsing

SUFFIXES = ["", "m", "k", "M", "G", "T", "Ki", "Mi", "Gi", "Ti"]


def by_the_client(text: str) -> decimal.Decimal:
    amount = quantity.parse_quantity(text)
    return amount if 0 <= amount <= 2**63 else decimal.Decimal(0)


@given(digits=st.text("0123456789", min_size=1, max_size=20), suffix=st.sampled_from(SUFFIXES))
def test_a_plain_quantity_reads_as_the_client_parser_reads_it(digits: str, suffix: str) -> None:
    text = digits + suffix
    assert parsing.request_quantity(text) == by_the_client(text)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("4", decimal.Decimal(4)),
        ("500m", decimal.Decimal("0.5")),
        ("16Gi", decimal.Decimal(16 * 2**30)),
        ("2G", decimal.Decimal(2 * 10**9)),
        ("1.5", decimal.Decimal("1.5")),  # not plain: the client's parser
        ("1e3", decimal.Decimal(1000)),
        ("999999999999999999Ti", decimal.Decimal(0)),  # above 2**63: unreadable, counts as 0
        ("１２", decimal.Decimal(0)),  # full-width digits are not a quantity
        ("4 ", decimal.Decimal(0)),
        (True, decimal.Decimal(0)),
    ],
)
def test_request_values(value: object, expected: decimal.Decimal) -> None:
    assert parsing.request_quantity(value) == expected


@given(
    value=st.builds(lambda d, s: d + s, st.text("0123456789", min_size=1, max_size=20), st.sampled_from(SUFFIXES))
    | st.sampled_from(["1.5", "1e3", "0.0001", "4 ", "１２", "", "-1"])
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.booleans()
    | st.none()
)
def test_cpu_millicores_read_without_decimal_are_those_of_the_quantity(value: object) -> None:
    """The CPU count of pods of any size (webhook/cpudemand.py) agrees with the class choice's reading."""
    assert parsing.cpu_milli(value) == int(parsing.request_quantity(value) * 1000)
