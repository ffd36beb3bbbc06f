"""The one constructor of a `LevelSplit` (rundir/results.py): attribute's levels (analysis/attribution.py),
the trace route's one level (trace/summary.py) and a level with no split all come through `level_split`.

Units: ms per token, tok/s for the ceilings.
"""

from __future__ import annotations

from typing import Any

from tpcomm.analysis.split import shares_pct
from tpcomm.rundir.results import LevelSplit, RankTerms, Terms
from tpcomm.terms import ENGINE_TERMS

CEILINGS = ("comm_only_tok_per_s", "comm_and_wait_only_tok_per_s", "compute_only_tok_per_s")


def level_split(
    concurrency: int, repeat: int, source: str, window: dict | None, sp: dict | None, note: str | None, **rest: Any
) -> LevelSplit:
    """A level from engine_split()'s dict `sp` (analysis/split.py): attributed when it has per-token terms.
    With `sp` None the level has no split and `note` says why. `rest` sets the other fields (the client side,
    closure, sites, flags, ...) and overrides what `sp` gives (the trace route's clock, a window's step counts)."""
    sp = sp or {}
    pt = sp.get("per_token_ms")
    terms = Terms(**{k: pt[k] for k in ENGINE_TERMS}) if pt else None
    ms = sp.get("engine_ms_per_token")
    fields: dict[str, Any] = dict(
        concurrency=concurrency,
        repeat=repeat,
        attributed=terms is not None,
        note=note,
        window=window,
        source=source,
        clock=sp.get("clock", "host"),
        engine_ms_per_token=ms,
        per_token_ms=terms,
        shares_pct=shares_pct(terms.as_dict(), ms) if terms and ms else None,
        by_rank=[
            RankTerms(r["rank"], r["period_ms"], Terms(**r["per_token_ms"]), r["pairs"], r["sampled_pairs"])
            for r in sp.get("by_rank") or []
        ]
        if terms
        else [],
        decode_pairs=int(sp.get("decode_pairs") or 0),
        sampled_pairs_share=sp.get("sampled_pairs_share"),
        seqs_per_step=sp.get("seqs_per_step"),
        steps_in_window=sp.get("steps_in_window") or {},
        ceilings_tok_per_s={k: sp.get(k) for k in CEILINGS} if sp else {},
        client=None,
        stalls=None,
        closure=None,
        delivery=None,
        top_sites=[],
        collectives_per_step={},
    )
    fields.update(rest)
    return LevelSplit(**fields)
