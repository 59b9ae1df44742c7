"""Kubernetes quantities ("500m", "16Gi", "2e3") read exactly, as Decimal: the one parser every
part of gpuslice uses, from the webhook's annotations to the simulator's scheduler.

The grammar is apimachinery's resource.Quantity: an optional sign, a decimal number in ASCII
digits, then at most one of a binary suffix (Ki Mi Gi Ti Pi Ei), a decimal suffix (n u m k M G T
P E) or a decimal exponent ("e3", "E-2"). Python's Decimal() alone is looser (it takes " 12",
"1_0", "１２", "NaN", "Infinity"), so the text must match the grammar first. Arithmetic is exact:
the number is multiplied by its suffix's power in a context wide enough to hold every digit, so
"0.1Mi" is 104857.6, not a value rounded to 28 digits.

What a caller does with an amount that is negative, fractional or absurdly large is the caller's
choice: the conversions below say how they round, and a caller names its own value in its own
error message by catching QuantityError.

May import gpuslice.messages (how a bad value is quoted) and the standard library.
"""

from __future__ import annotations

import decimal
import math
import re
from typing import Any, NamedTuple

from gpuslice import messages

__all__ = [
    "FORMS",
    "MIB",
    "Quantity",
    "QuantityError",
    "mebibytes",
    "mib_down",
    "mib_up",
    "parse",
    "read",
    "whole_mebibytes",
]

MIB = 2**20
FORMS = 'a Kubernetes quantity such as "4", "500m", "16Gi", "2G" or "2e3"'

_DIGITS = "[0-9]"  # not \d: that matches every Unicode digit
_NUMBER = rf"(?:{_DIGITS}+(?:\.{_DIGITS}*)?|\.{_DIGITS}+)"
_GRAMMAR = re.compile(
    rf"(?P<number>[+-]?{_NUMBER})"
    rf"(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE](?P<exponent>[+-]?{_DIGITS}+))?",
    re.ASCII,
)
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}  # powers of 2
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}  # powers of 10


# Wide enough to hold every digit of a product by 2**60 and any exponent Decimal can hold, and
# trapping anything inexact: only exact operations use it (a product, a shift, a division by 2**20).
_WIDE = decimal.Context(
    prec=decimal.MAX_PREC,
    Emax=decimal.MAX_EMAX,
    Emin=decimal.MIN_EMIN,
    traps=[decimal.InvalidOperation, decimal.Overflow, decimal.Underflow, decimal.Inexact, decimal.DivisionByZero],
)


class QuantityError(ValueError):
    """A value is not a Kubernetes quantity; the message quotes it and says why."""


class Quantity(NamedTuple):
    """One quantity as written: its exact amount and the suffix it was written with."""

    amount: decimal.Decimal
    suffix: str  # "", a binary or decimal suffix, or an exponent as written ("e3")

    @property
    def scaled(self) -> bool:
        """Whether the suffix names a unit (binary or decimal SI), rather than none or an exponent
        (both of which leave the number in the caller's own unit)."""
        return self.suffix in _BINARY or self.suffix in _DECIMAL


def read(text: str) -> Quantity:
    """`text` as a Quantity; QuantityError when it does not follow the grammar."""
    if not isinstance(text, str):
        raise QuantityError(f"{messages.quote(text)} is not a string; accepted: {FORMS}")
    match = _GRAMMAR.fullmatch(text)
    if match is None:
        raise QuantityError(f"{messages.quote(text)} is not a quantity; accepted: {FORMS}")
    number, suffix, exponent = match.group("number", "suffix", "exponent")
    suffix = suffix or ""
    if exponent is not None:
        # Decimal keeps the exponent as written: "1e999999999" is a small object, only ever compared.
        try:
            return Quantity(_WIDE.create_decimal(number + "e" + exponent), suffix)
        except decimal.DecimalException:
            raise QuantityError(f"{messages.quote(text)} has an exponent out of range; accepted: {FORMS}") from None
    amount = decimal.Decimal(number)
    if suffix in _BINARY:
        amount = _exact(amount, 2 ** _BINARY[suffix])
    elif suffix:
        amount = amount.scaleb(_DECIMAL[suffix], _WIDE)
    return Quantity(amount, suffix)


def _exact(amount: decimal.Decimal, factor: int) -> decimal.Decimal:
    return _WIDE.multiply(amount, decimal.Decimal(factor))


def parse(value: Any) -> decimal.Decimal:
    """The exact amount of a quantity: a string in the grammar, or an int (a float by its
    shortest decimal form, as a JSON number is written). QuantityError otherwise."""
    if isinstance(value, bool):
        raise QuantityError(f"{messages.quote(value)} is a boolean, not a quantity; accepted: {FORMS}")
    if isinstance(value, int):
        return decimal.Decimal(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"{messages.quote(value)} is not a finite number; accepted: {FORMS}")
        return read(repr(value)).amount
    return read(value).amount


def _bounded(amount: decimal.Decimal, limit: int) -> decimal.Decimal:
    """`amount` in bytes as MiB, exactly; QuantityError beyond `limit` MiB (a huge exponent is
    compared here, never expanded into an integer of a billion digits)."""
    mib = _WIDE.divide(amount, decimal.Decimal(MIB))
    if mib.copy_abs() > limit:  # no context: a compare never overflows
        raise QuantityError(f"{amount} bytes is beyond {limit} MiB either way")
    return mib


def mib_down(amount: decimal.Decimal, *, limit: int = 2**63) -> int:
    """Whole MiB in `amount` bytes, rounded toward zero (what a node can still give)."""
    return int(_bounded(amount, limit))


def mib_up(amount: decimal.Decimal, *, limit: int = 2**63) -> int:
    """Whole MiB in `amount` bytes, rounded up (what a request needs)."""
    return math.ceil(_bounded(amount, limit))


def mebibytes(mib: int) -> str:
    """`mib` written as a quantity in MiB ("81920Mi"), the form gpuslice publishes."""
    return f"{mib}Mi"


_WHOLE_MI = re.compile(r"([0-9]+)Mi", re.ASCII)


def whole_mebibytes(value: Any) -> int | None:
    """The MiB of a quantity written as `mebibytes` writes it; None for any other spelling."""
    match = _WHOLE_MI.fullmatch(value) if isinstance(value, str) else None
    return int(match.group(1)) if match else None
