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
import json.scanner
import math
from typing import Any

from tpcomm.errors import InputError

MAX_DEPTH = 64  # a run directory's documents nest 6 deep; a hook reply 4
MAX_INT_DIGITS = 20  # beyond int64 (19 digits): never a count, a time in ns or an id tpcomm writes
_CONTAINERS = frozenset((dict, list))  # json.loads makes no subclasses of them


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


# A number the hooks above would refuse has a run of more than MAX_INT_DIGITS digits (a long integer, or a float
# of 309 digits or more) or an exponent of three digits or more (1e400): text without either parses with Python's
# own number parsing, in C (the hooks cost a Python call per number, 2.7x the plain parse of a records page).
# Found by a byte scan (every digit made 0, E made e, then plain substring searches: 0.06 s on 7.7 MB, where a
# regular expression took 0.3 s); digits or an "e" inside strings may send a document the slow way, never a risky
# number the fast way.
_SCAN = bytes.maketrans(b"123456789E", b"000000000e")
_RISKS = (b"0" * (MAX_INT_DIGITS + 1), b"e000", b"e+000", b"e-000")


def _risky_numbers(data: bytes | str) -> bool:
    """True when `data` may hold a number the hooks refuse (see above); False only when it cannot."""
    if not isinstance(data, (str, bytes, bytearray)) or json.scanner.c_make_scanner is None:
        return True  # json.loads answers other types; its pure-Python scanner's \d takes non-ASCII digits
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if not isinstance(data, str) and json.detect_encoding(raw) != "utf-8":  # UTF-16/32: digits apart, scan the slow way
        return True
    scanned = raw.translate(_SCAN)
    return any(r in scanned for r in _RISKS)


def loads(data: bytes | str, what: str, expected: str = "a JSON document as tpcomm writes it") -> Any:
    """The document in `data`, or BadJSON naming `what`: not JSON, nested deeper than MAX_DEPTH, NaN or
    infinite numbers, integers beyond MAX_INT_DIGITS digits."""
    hooks: dict[str, Any] = {"parse_float": _float, "parse_int": _int} if _risky_numbers(data) else {}
    try:
        doc = json.loads(data, parse_constant=_constant, **hooks)
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
        elif isinstance(node, list) and not _CONTAINERS.isdisjoint(map(type, node)):  # numbers only: skipped in C
            stack.extend((v, depth + 1) for v in node if isinstance(v, (dict, list)))
