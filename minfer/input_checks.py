"""Checking a value a user handed in: one function per kind of field, each naming the field when it refuses.

A request's fields travel far before they are used: a stop token id is read in every step, a temperature
reaches a tensor in the sampler. A wrong type found there fails the whole batch -- every other request in
the step with it. So every field is checked where it enters (``SamplingParams``, ``add_request``,
``EngineConfig``), and a refusal is a ``ValueError`` that says which field, what it got, and what it accepts.

Two Python details matter: ``bool`` is a subclass of ``int`` (``True`` is not a token id), and a float may be
NaN or infinite. NumPy scalars are accepted (``numbers.Integral``/``numbers.Real``) and turned into plain
Python numbers, so nothing downstream sees an unexpected type.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

INT32_MAX = 2**31 - 1
INT63_MAX = 2**63 - 1


def _refuse(name: str, value: Any, expected: str) -> ValueError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return ValueError(f"{name} must be {expected}, got {shown}")


def integer(name: str, value: Any, low: int | None = None, high: int | None = None) -> int:
    """An integer (not a bool) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise _refuse(name, value, "an integer" + _range(low, high))
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise _refuse(name, value, "an integer" + _range(low, high))
    return value


def real(name: str, value: Any, low: float | None = None, high: float | None = None, *,
         low_open: bool = False) -> float:
    """A finite number (not a bool) in ``[low, high]`` -- or ``(low, high]`` with ``low_open``."""
    if not isinstance(value, bool) and isinstance(value, numbers.Real):
        try:
            number = float(value)
        except OverflowError:  # an int too large for a float
            pass
        else:
            value = number
            if (math.isfinite(value) and (low is None or value > low or (value == low and not low_open))
                    and (high is None or value <= high)):
                return value
    # the message is written only for a refusal: every request's fields pass through here
    raise _refuse(name, value, "a finite number" + _range(low, high, low_open))


def boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _refuse(name, value, "True or False")
    return value


def text(name: str, value: Any, *, optional: bool = False) -> str | None:
    """A non-empty string (or None, if ``optional``)."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise _refuse(name, value, "a non-empty string" + (" or None" if optional else ""))
    return value


def integer_list(name: str, value: Any, low: int = 0, high: int | None = None) -> list[int]:
    """A list (or tuple) of integers in ``[low, high]``; a single int or a string is refused, not wrapped."""
    if not isinstance(value, (list, tuple)):
        raise _refuse(name, value, "a list of integers" + _range(low, high))
    # the usual case, a prompt of plain ints, in three cheap passes (a 5,000-token prompt: a checked call per
    # token costs more than scheduling it); anything else (NumPy ints, a bad entry) goes element by element,
    # so a refusal names the entry
    plain = {*map(type, value)} <= {int}  # exactly int: leaves out bool (and an empty list is plain)
    if plain and (not value or (min(value) >= low and (high is None or max(value) <= high))):
        return list(value)
    return [integer(f"{name}[{i}]", v, low, high) for i, v in enumerate(value)]


def text_list(name: str, value: Any) -> list[str]:
    """A string or a list (or tuple) of non-empty strings, as a list."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise _refuse(name, value, "a string or a list of strings")
    return [text(f"{name}[{i}]", v) for i, v in enumerate(value)]  # type: ignore[misc]


def one_of(name: str, value: Any, allowed: Sequence[str]) -> Any:
    if not isinstance(value, str) or value not in allowed:
        raise _refuse(name, value, f"one of {tuple(allowed)}")
    return value


def _range(low: float | None, high: float | None, low_open: bool = False) -> str:
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{_n(low)}, {_n(high)}]"
    if low is not None:
        return f" {'>' if low_open else '>='} {_n(low)}"
    if high is not None:
        return f" <= {_n(high)}"
    return ""


def _n(x: float) -> str:
    names = {INT32_MAX: "2**31 - 1", -INT32_MAX - 1: "-2**31", INT63_MAX: "2**63 - 1"}
    if isinstance(x, int):
        return names.get(x, str(x))
    return f"{x:g}"
