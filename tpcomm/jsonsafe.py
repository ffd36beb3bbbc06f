"""JSON from somewhere tpcomm does not control (a shared run directory, a server's reply, a stream's chunk),
parsed with bounds: nesting depth, number types, and (by the caller, before parsing) size.

A 100 000-deep `[[[...]]]` status.json once ended `report` in a RecursionError traceback; NaN, Infinity,
1e400 (a float that overflows to inf) and integers of thousands of digits are not numbers tpcomm ever writes.
Each is a `BadJSON` (an InputError: one line, exit 2) naming the input, what is wrong and what was expected.

Python's own decoder guards its recursion (RecursionError near depth 1000, fast), so parsing is bounded; the
depth check after it is iterative and keeps what a reader later walks recursively (redaction, the contract's
checks, the report) far from the recursion limit.
"""

from __future__ import annotations

import json
import math
from typing import Any

from tpcomm.errors import InputError

MAX_DEPTH = 64  # a run directory's documents nest 6 deep; a hook reply 4
MAX_INT_DIGITS = 20  # beyond int64 (19 digits): never a count, a time in ns or an id tpcomm writes


class BadJSON(InputError):
    """JSON that parses but is not something tpcomm could have written (or does not parse)."""


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number tpcomm writes")


def _float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"{text[:30]} overflows a double")
    return v


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def loads(data: bytes | str, what: str, expected: str = "a JSON document as tpcomm writes it") -> Any:
    """The document in `data`, or BadJSON naming `what`: not JSON, nested deeper than MAX_DEPTH, NaN or
    infinite numbers, integers beyond MAX_INT_DIGITS digits."""
    try:
        doc = json.loads(data, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except RecursionError:
        raise BadJSON(what, f"is nested deeper than {MAX_DEPTH} levels", expected) from None
    except json.JSONDecodeError as e:
        raise BadJSON(what, f"is not valid JSON ({e.msg}, at byte {e.pos})", expected) from None
    except UnicodeDecodeError:
        raise BadJSON(what, "is not valid JSON (not UTF-8 text)", expected) from None
    except ValueError as e:  # from the number hooks above
        raise BadJSON(what, f"holds a number out of range: {e}", expected) from None
    check_depth(doc, what, expected)
    return doc


def check_depth(doc: Any, what: str, expected: str = "a JSON document as tpcomm writes it") -> None:
    """BadJSON when `doc` nests deeper than MAX_DEPTH (walked without recursion)."""
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise BadJSON(what, f"is nested deeper than {MAX_DEPTH} levels", expected)
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node if isinstance(v, (dict, list)))
