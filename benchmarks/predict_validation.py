"""`tpcomm predict` against public decode measurements (tpcomm/predict/data/validation.json).

    .venv/bin/python benchmarks/predict_validation.py            # every row
    .venv/bin/python benchmarks/predict_validation.py --ids a,b  # a subset
    .venv/bin/python benchmarks/predict_validation.py --json
    .venv/bin/python benchmarks/predict_validation.py --loso [--by publisher]  # leave one source out

Prints per row: measured tok/s, the central prediction, the range over the stated inputs, inside or not, the
error of the central value; in total, for the held-out TP >= 2 rows and apart for the rows that set a number
in tpcomm (fitted) or run at TP 1: the share inside, the median |error| and the median half-width of the range.
Targets (issue 19): >= 85% inside, median |error| <= 20%, median half-width <= 35% of the central value.

--loso (tpcomm/predict/loso.py): every source's rows held out together while the fitted constants are refitted on
the other sources; per source its rows and the constants it informed (with every source / without it), and the
share inside and median |error| of leave-one-source-out beside the in-sample figures (the same refit on every
source, and the shipped constants), over every row and over the TP >= 2 rows. Targets (issue 29): >= 80%
inside, median |error| <= 20%.
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
    ap.add_argument("--loso", action="store_true", help="leave-one-source-out beside the in-sample figures")
    ap.add_argument("--by", choices=("source", "publisher"), default="source", help="--loso: what is held out together")
    a = ap.parse_args(argv)
    if a.loso:
        return loso_main(a.by, a.json)
    results = run(a.ids.split(",") if a.ids else None)
    held = [r for r in results if r.held_out]
    other = [r for r in results if not r.held_out]
    doc = {
        "rows": [r.as_dict() for r in results],
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


def loso_main(by: str, as_json: bool) -> int:
    from tpcomm.predict.loso import report, short
    from tpcomm.table import render

    doc = report(by)
    if as_json:
        print(json.dumps(doc, indent=2))
        return 0
    for src in doc["sources"]:
        print(f"\nheld out: {short(src['source'])} ({len(src['rows'])} rows)")
        for n, v in src["informed"].items():
            w, wo = v["with_every_source"], v["without_this_source"]
            print(
                f"  informed {n}: {w['central']:.3g} ({w['low']:.3g}-{w['high']:.3g}) with every source; "
                f"without it {wo['central']:.3g} ({wo['low']:.3g}-{wo['high']:.3g}), {wo['source']}"
            )
        rows = [
            [
                r["id"],
                r["tp"],
                _fmt(r["measured_tok_per_s"]),
                _fmt(r["central_tok_per_s"]),
                f"{_fmt(r['low_tok_per_s'])}-{_fmt(r['high_tok_per_s'])}",
                "yes" if r["inside"] else "NO",
                _fmt(r["error_pct"], "+.0f") + "%",
            ]
            for r in src["rows"]
        ]
        print(render(["row", "TP", "measured", "central", "range", "inside", "error"], rows, "lrrrrlr"))
    print(f"\nheld out together: every row of one {by}")
    table = []
    for name, s in doc["summary"].items():
        for pop, x in s.items():
            table.append(
                [
                    name.replace("_", " "),
                    pop.replace("_", " "),
                    x["rows"],
                    x["inside"],
                    f"{100 * (x['share_inside'] or 0):.0f}%",
                    f"{_fmt(x['median_abs_error_pct'])}%",
                    f"{_fmt(x['median_half_width_pct'])}%",
                ]
            )
    print(
        render(["constants", "rows", "n", "inside", "share", "median |error|", "median half-width"], table, "llrrrrr")
    )
    print("targets (issue 29, leave one source out): >= 80% inside, median |error| <= 20%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
