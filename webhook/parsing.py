"""Reading the values users write in annotations and resource maps: a share of a GPU, an amount
of GPU memory, a count of GPUs or devices, a switch. Pure; no I/O.

Strict on purpose. Python's int(), float() and Decimal() accept "１２" (full-width digits), "1_0"
and " 12 ", which Kubernetes' own quantity grammar and KAI's parsers do not: every value must
match an ASCII grammar first, and only then is it converted (amounts by gpuslice.quantity, the
one quantity parser). A value that does not fit raises `Invalid` with a message naming the
annotation, a short quote of the value (at most QUOTE_CHARS characters) and the accepted forms.

May import gpuslice.{messages,quantity} only.
"""

from __future__ import annotations

import decimal
import functools
import math
import re
from typing import Any

from gpuslice import quantity
from gpuslice.messages import QUOTE_CHARS, cut, quote

__all__ = [
    "BOOLEAN_FORMS",
    "Invalid",
    "QUOTE_CHARS",
    "boolean",
    "count",
    "cpu_milli",
    "cut",
    "fraction",
    "memory_mib",
    "quote",
    "request_quantity",
]

# No valid value is longer: the longest useful quantity is some 20 characters.
_MAX_VALUE_CHARS = 64
# Larger amounts of GPU memory are refused before any arithmetic (1 EiB in MiB).
_MAX_MEMORY_MIB = 2**40

_DIGITS = "[0-9]"  # not \d: that matches every Unicode digit
_NUMBER = rf"(?:{_DIGITS}+(?:\.{_DIGITS}*)?|\.{_DIGITS}+)"
_FRACTION_RE = re.compile(rf"[+-]?{_NUMBER}(?:[eE][+-]?{_DIGITS}+)?", re.ASCII)
_COUNT_RE = re.compile(rf"{_DIGITS}+", re.ASCII)

FRACTION_FORMS = 'a decimal number greater than 0 and at most 1, such as "0.5"'
MEMORY_FORMS = (
    'MiB as a positive number such as "2000" or "2e3", or a Kubernetes quantity in bytes such as "20Gi" or "512Mi"'
)


class Invalid(ValueError):
    """A value cannot be used; the message says which, why, and what is accepted."""


def _text(name: str, value: Any, forms: str) -> str:
    """The value as a string within the length limit, or Invalid."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise Invalid(f"{name}={quote(value)} is not a string; accepted: {forms}")
    text = value if isinstance(value, str) else str(value)
    if len(text) > _MAX_VALUE_CHARS:
        raise Invalid(f"{name}={quote(text)} is too long to be a number; accepted: {forms}")
    return text


def fraction(name: str, value: Any) -> float:
    """A share of one GPU: greater than 0, at most 1."""
    text = _text(name, value, FRACTION_FORMS)
    if not _FRACTION_RE.fullmatch(text):
        raise Invalid(f"{name}={quote(text)} is not a number; accepted: {FRACTION_FORMS}")
    number = float(text)  # the grammar leaves out nan, inf and everything float() reads loosely
    if number == 0:
        raise Invalid(f"{name}={quote(text)} is zero; accepted: {FRACTION_FORMS}")
    if number < 0:
        raise Invalid(f"{name}={quote(text)} is negative; accepted: {FRACTION_FORMS}")
    if number > 1:
        raise Invalid(
            f"{name}={quote(text)} is above 1 (one whole GPU); accepted: {FRACTION_FORMS}; "
            "for more than one GPU request nvidia.com/gpu"
        )
    return number


def memory_mib(name: str, value: Any) -> int:
    """GPU memory in MiB, rounded up: a bare number (or one with a decimal exponent) is MiB, a
    number with a binary or decimal suffix is bytes."""
    text = _text(name, value, MEMORY_FORMS)
    try:
        read = quantity.read(text)
    except quantity.QuantityError:
        raise Invalid(f"{name}={quote(text)} is not a number or quantity; accepted: {MEMORY_FORMS}") from None
    if read.suffix in ("n", "u", "m"):
        raise Invalid(f"{name}={quote(text)} is a fraction of a byte; accepted: {MEMORY_FORMS}")
    amount = read.amount
    if amount.is_zero():
        raise Invalid(f"{name}={quote(text)} is zero; accepted: {MEMORY_FORMS}")
    if amount < 0:
        raise Invalid(f"{name}={quote(text)} is negative; accepted: {MEMORY_FORMS}")
    too_large = f"{name}={quote(text)} is larger than any GPU; accepted: {MEMORY_FORMS}"
    if read.scaled:  # a unit: bytes
        try:
            return max(1, quantity.mib_up(amount, limit=_MAX_MEMORY_MIB))
        except quantity.QuantityError:
            raise Invalid(too_large) from None
    # A bare number or one with an exponent is MiB; a huge exponent ("1e999999999") is only
    # compared, never expanded.
    if amount > _MAX_MEMORY_MIB:
        raise Invalid(too_large)
    return max(1, math.ceil(amount))


def count(name: str, value: Any, *, forms: str) -> int:
    """A whole number of 0 or more (GPUs, devices); at most 2**31."""
    text = _text(name, value, forms)
    if not _COUNT_RE.fullmatch(text) or int(text) > 2**31:
        raise Invalid(f"{name}={quote(text)} is not a whole number; accepted: {forms}")
    return int(text)


BOOLEAN_FORMS = '"true" or "false"'


def boolean(name: str, value: Any) -> bool:
    """A switch: exactly "true" or "false", as Kubernetes writes them ("True", "yes" and "1" are
    refused rather than guessed)."""
    if value == "true":
        return True
    if value == "false":
        return False
    raise Invalid(f"{name}={quote(value)} is not a boolean; accepted: {BOOLEAN_FORMS}")


def request_quantity(value: Any) -> decimal.Decimal:
    """A CPU or memory request as the scheduler reads it; 0 when unreadable or absurd (the API
    server validates requests after the webhook, and the caller only uses it to prefer a class)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return decimal.Decimal(0)
    return _request_quantity(str(value))


# Whole numbers with no or a common suffix ("4", "500m", "16Gi", "2G"), as nearly all requests are
# written: read with integer arithmetic, where the client's parser costs some 5 µs a value. Exact:
# the scale is a power of 2 or 10, and Decimal holds 28 digits.
_PLAIN_QUANTITY_RE = re.compile(r"([0-9]{1,18})(m|k|M|G|T|Ki|Mi|Gi|Ti)?", re.ASCII)
_PLAIN_SCALE = {
    None: 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}
_MILLI = decimal.Decimal(1000)


def cpu_milli(value: Any) -> int:
    """A CPU request in millicores, as `request_quantity` reads it, with integer arithmetic alone
    for the plain forms: pods of any size are counted (webhook/cpudemand.py), where a memo misses."""
    if isinstance(value, str):
        milli = _plain_milli(value)
        if milli is not None:
            return milli
    return int(request_quantity(value) * 1000)


# A CPU pod answered from memory still has its CPU read (webhook/cpudemand.py); pods repeat a
# handful of values ("4", "500m"), and a memo hit costs a fifth of the regex.
@functools.lru_cache(maxsize=4096)
def _plain_milli(text: str) -> int | None:
    """Thousandths of a plain quantity (0 above 2**63), or None when `text` is not plain."""
    plain = _PLAIN_QUANTITY_RE.fullmatch(text)
    if plain is None:
        return None
    digits, suffix = plain.groups()
    if suffix == "m":
        return int(digits)
    whole = int(digits) * _PLAIN_SCALE[suffix]
    return whole * 1000 if whole <= 2**63 else 0


# Pods repeat a handful of request values ("4", "16Gi"); parsing one is most of a class choice's cost.
@functools.lru_cache(maxsize=4096)
def _request_quantity(text: str) -> decimal.Decimal:
    milli = _plain_milli(text)
    if milli is not None:
        return decimal.Decimal(milli) / _MILLI
    if len(text) > _MAX_VALUE_CHARS:
        return decimal.Decimal(0)
    try:
        amount = quantity.parse(text)
    except quantity.QuantityError:
        return decimal.Decimal(0)
    return amount if 0 <= amount <= 2**63 else decimal.Decimal(0)
