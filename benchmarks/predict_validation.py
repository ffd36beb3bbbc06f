"""`tpcomm predict` against public decode measurements (tpcomm/predict/data/validation.json).

    .venv/bin/python benchmarks/predict_validation.py            # every row
    .venv/bin/python benchmarks/predict_validation.py --ids a,b  # a subset
    .venv/bin/python benchmarks/predict_validation.py --json

Prints per row: measured tok/s, the central prediction, the range over the stated inputs, inside or not, the
error of the central value; in total, for the held-out TP >= 2 rows and apart for the rows that set a number
in tpcomm (fitted) or run at TP 1: the share inside, the median |error| and the median half-width of the range.
Targets (issue 19): >= 85% inside, median |error| <= 20%, median half-width <= 35% of the central value.
"""

from __future__ import annotations

import argparse
import json
import sys

from tpcomm.predict.validation import run, summary

TARGETS = {"share_inside": 0.85, "median_abs_error_pct": 20.0, "median_half_width_pct": 35.0}


def _fmt(x, f=".1f"):
    return "-" if x is None else format(x, f)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ids", default=None, help="comma-separated row ids (default: every row)")
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    a = ap.parse_args(argv)
    results = run(a.ids.split(",") if a.ids else None)
    held = [r for r in results if r.held_out]
    other = [r for r in results if not r.held_out]
    doc = {
        "rows": [
            {
                "id": r.row["id"],
                "held_out": r.held_out,
                "measured_tok_per_s": r.measured,
                "central_tok_per_s": r.central,
                "low_tok_per_s": r.low,
                "high_tok_per_s": r.high,
                "inside": r.inside,
                "error_pct": r.error_pct,
                "half_width_pct": r.half_width_pct,
                "error": r.error,
            }
            for r in results
        ],
        "held_out": summary(held),
        "fitted_or_tp1": summary(other),
        "targets": TARGETS,
    }
    if a.json:
        print(json.dumps(doc, indent=2))
        return 0
    from tpcomm.table import render

    rows = [
        [
            r.row["id"],
            "held out" if r.held_out else ("fitted" if r.row.get("fitted") else "TP 1"),
            r.row.get("engine") or "",
            r.row["batch"],
            _fmt(r.measured),
            _fmt(r.central),
            f"{_fmt(r.low)}-{_fmt(r.high)}",
            "yes" if r.inside else "NO",
            _fmt(r.error_pct, "+.0f") + "%" if r.error_pct is not None else r.error,
            _fmt(r.half_width_pct, ".0f") + "%" if r.half_width_pct is not None else "-",
        ]
        for r in results
    ]
    print(
        render(
            ["row", "kind", "engine", "B", "measured", "central", "range", "inside", "error", "half-width"],
            rows,
            "lllrrrrlrr",
        )
    )
    for name, s in (
        ("held-out TP >= 2 rows", doc["held_out"]),
        ("fitted / TP-1 rows (counted apart)", doc["fitted_or_tp1"]),
    ):
        if not s["rows"]:
            continue
        print(
            f"\n{name}: {s['rows']} rows, {s['inside']} inside = {100 * (s['share_inside'] or 0):.0f}% "
            f"(target >= {100 * TARGETS['share_inside']:.0f}%); median |error| {_fmt(s['median_abs_error_pct'])}% "
            f"(target <= {TARGETS['median_abs_error_pct']:.0f}%); median half-width {_fmt(s['median_half_width_pct'])}% "
            f"of the central value (target <= {TARGETS['median_half_width_pct']:.0f}%)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
