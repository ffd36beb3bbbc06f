"""The data of the report's sections, typed: what analysis.py and first_page.py build and what tables.py,
figures.py and the renderers lay out. One dataclass per section whose fields the layout reads by name.

Units: *_ms milliseconds per token, tok/s per stream, *_pct percent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tpcomm.rundir.results import LevelSplit, Lever, Verdict


@dataclass
class TokenSplit:
    """The bar of page one: where each token goes, summing to `total_ms` (the headline's per-token time)."""

    terms: dict[str, float]  # term name (tpcomm/terms.py) -> ms per token
    total_ms: float
    source: str  # "measured" or "model-based"
    shares_pct: dict[str, float] | None = None  # measured only: each term's share of total_ms


@dataclass
class PageOne:
    """Page one (first_page.py builds it): the headline, its conditions, where each token goes, the verdict in at
    most three sentences, the levers and the definitions of the terms used.

    `numbers` are the headline's figures by name for `tpcomm report --json` (tok_per_s, ms_per_token,
    concurrency, each term's *_ms and *_pct, the client's, the delivery term's; only those measured or derived)."""

    source: str | None = None  # "measured", "model-based", None: nothing to conclude
    headline: str | None = None
    conditions: str = ""
    warning: str | None = None  # an incomplete run, collectives the hook did not time
    sentences: list[str] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)
    level: LevelSplit | None = None  # the level that speaks (measured split)
    verdict: Verdict | None = None
    split: TokenSplit | None = None
    client_ms: float | None = None  # the client's time per token beside the bar (the closure's p50)
    five: tuple | None = None  # (header, rows, widths): the token as the client saw it (five_terms_table)
    levers: list[Lever] = field(default_factory=list)
    bounds: list[Lever] = field(default_factory=list)
    levers_note: str | None = None
    definitions: list[str] = field(default_factory=list)
