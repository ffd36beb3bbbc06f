"""The split's terms, defined once: name (the key in `Terms` and every JSON), label, colour, unit and the
one-line definition every output prints. The split (analysis/split.py), the trace route, compare's tables,
the report's tables and figures and judge/definitions.py read them from here.

Units: every term is milliseconds per token.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Term:
    name: str
    label: str  # in a table of terms or a legend
    long_label: str  # where it stands alone (compare's rows)
    colour: str  # figures
    unit: str
    definition: str | None  # None: judge/definitions.py builds it from the tolerances it cites


# The four engine terms: per decode step, they add up to the engine's time per token.
ENGINE = (
    Term(
        "compute",
        "compute",
        "compute",
        "#4C72B0",
        "ms",
        "compute: the step minus its collectives (kernels, weight reads)",
    ),
    Term(
        "transfer",
        "transfer",
        "collective transfer",
        "#DD8452",
        "ms",
        "transfer: per collective, the shortest time any rank spent in it: all ranks inside together, the link at work",
    ),
    Term(
        "wait",
        "wait",
        "collective wait",
        "#C44E52",
        "ms",
        "wait: each rank's time in a collective beyond that shortest: rank skew, which a faster link does not remove",
    ),
    Term(
        "host_gap",
        "host gap",
        "host gap",
        "#8C8C8C",
        "ms",
        "host gap: from the end of the step before a decode step to its start (scheduling, output processing)",
    ),
)
# The fifth: with the four over the same requests it adds up to the client's time per token (analysis/delivery.py).
DELIVERY = Term("delivery_term", "delivery", "delivery (fifth term, pooled per token)", "#64B5CD", "ms", None)

ENGINE_TERMS = tuple(t.name for t in ENGINE)
BY_NAME = {t.name: t for t in (*ENGINE, DELIVERY)}
