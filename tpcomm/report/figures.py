"""The report's figures, drawn with matplotlib from analysis.py's data.

Each `fig_*` takes a Section's data and returns a matplotlib Figure, or None
when the section has no data. `to_pdf_bytes` saves a figure as a one-page
vector PDF with TrueType text (searchable once placed in the report), which
pdf.py stamps into the report page; `to_svg_bytes` is for the Markdown twin.

Units: x axes in bytes or concurrency, times in us/ms as labelled.
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg", force=False)
from matplotlib.figure import Figure  # noqa: E402  (pyplot-free: no global state, no GUI)

from tpcomm.report.sections import (  # noqa: E402
    BreakdownSection,
    LadderSection,
    PageOne,
    ProbeSection,
    WhatIfSection,
)
from tpcomm.rundir.documents import Timeline  # noqa: E402
from tpcomm.terms import BY_NAME, ENGINE, ENGINE_TERMS  # noqa: E402

matplotlib.rcParams.update(
    {
        "pdf.fonttype": 42,
        "svg.fonttype": "none",
        "font.size": 8,
        "axes.titlesize": 9,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "axes.spines.top": False,
        "axes.spines.right": False,
    }
)

COLORS = {
    **{t.name: t.colour for t in ENGINE},  # the split's terms (tpcomm/terms.py)
    "host_overhead": BY_NAME["host_gap"].colour,
    "weights": "#4C72B0",
    "collectives": "#DD8452",
    "overhead": "#8C8C8C",
    "kv_cache": "#64B5CD",
}
WIDTH_IN = 6.6


def to_pdf_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="pdf", bbox_inches="tight", pad_inches=0.02)
    return buf.getvalue()


def to_svg_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", pad_inches=0.02)
    return buf.getvalue()


def fig_token_split(page: PageOne) -> Figure | None:
    """One horizontal bar: where the milliseconds of one token go; it ends at the headline's per-token time."""
    split = page.split
    if not split:
        return None
    total = split.total_ms
    terms = {k: v for k, v in split.terms.items() if isinstance(v, (int, float)) and v > 0}
    shares = split.shares_pct or {k: 100.0 * v / total for k, v in terms.items()}
    fig = Figure(figsize=(WIDTH_IN, 1.2))
    ax = fig.add_subplot()
    left = 0.0
    for k, v in terms.items():
        label = f"{k.replace('_', ' ')} {v:.3g} ms ({shares.get(k, 0):.1f}%)"
        ax.barh([0], [v], left=left, color=COLORS.get(k, None), label=label)
        left += v
    tpot = page.client_ms if split.source == "measured" else None
    if tpot:
        ax.plot([tpot], [0], "k^", ms=5, mfc="white", label=f"client {tpot:.3g} ms per token (p50; not in the split)")
    ax.set_xlim(0, max(left, tpot or 0) * 1.05 or 1)
    ax.set_yticks([])
    ax.set_xlabel(f"ms per {split.per} ({split.source}; the bar ends at the headline's {total:.3g} ms)")
    ax.legend(ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    ax.grid(False, axis="y")
    return fig


def fig_probe(probe: ProbeSection) -> Figure | None:
    if not probe.curves:
        return None
    fig = Figure(figsize=(WIDTH_IN, 3.4))
    ax_t, ax_b = fig.subplots(1, 2)
    # One colour per (backend, op); line style per timing; marker per mode (eager/graph).
    palette = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]
    keys = sorted({(c.get("backend"), c.get("op")) for c in probe.curves}, key=str)
    color = {k: palette[i % len(palette)] for i, k in enumerate(keys)}
    for c in probe.curves:
        pts = c["points"]
        label = " ".join(str(c[k]) for k in ("backend", "op", "mode", "timing") if c.get(k))
        style = dict(
            color=color[(c.get("backend"), c.get("op"))],
            ls="--" if c.get("timing") == "pipelined" else "-",
            marker="s" if c.get("mode") == "graph" else "o",
            ms=2.5,
            lw=1,
        )
        ax_t.plot([p[0] for p in pts], [p[1] for p in pts], label=label, **style)
        bw = [p for p in pts if p[2] is not None]
        if bw:
            ax_b.plot([p[0] for p in bw], [p[2] for p in bw], **style)
    for m in probe.model_sizes:
        ax_t.axvline(m["bytes"], color="k", lw=0.6, ls=":")
    for ax in (ax_t, ax_b):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes per rank)")
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time per call, p50 (us)")
    ax_t.set_title("latency (dotted: the model's message sizes)")
    ax_b.set_ylabel("bus bandwidth (GB/s)")
    ax_b.set_title("busbw (nccl-tests formula)")
    fig.legend(*ax_t.get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=6, frameon=False)
    fig.tight_layout(rect=(0, 0.06 + 0.035 * ((len(probe.curves) + 1) // 2), 1, 1))
    return fig


def fig_breakdown(breakdown: BreakdownSection) -> Figure | None:
    levels = breakdown.levels
    if not levels:
        return None
    fig = Figure(figsize=(WIDTH_IN, 2.6))
    ax = fig.add_subplot()
    xs = list(range(len(levels)))
    bottom = [0.0] * len(levels)
    # per token emitted (LevelSplit.token_view: under speculative decoding the step over its tokens); a level whose
    # tokens per step were not counted stays per engine step, named in the title
    views = [lv.token_view() for lv in levels]
    per_step = [ms is None for ms, _, _ in views]
    split = [lv.per_token_ms if ms is None else t for lv, (ms, t, _) in zip(levels, views)]
    for key in ENGINE_TERMS:
        raw = [getattr(t, key) if t else 0.0 for t in split]
        # A negative term cannot be stacked: drawn as 0 and marked (a measured split has none: each term is a mean of durations).
        vals = [max(v, 0.0) for v in raw]
        ax.bar(xs, vals, bottom=bottom, color=COLORS[key], width=0.55, label=BY_NAME[key].label)
        for x, v, b in zip(xs, raw, bottom):
            if v < 0:
                ax.annotate(
                    f"{key.replace('_', ' ')} {v:.2f} ms\n(< 0: not drawn)",
                    (x, b),
                    xytext=(0, 4),
                    textcoords="offset points",
                    ha="center",
                    fontsize=5,
                )
        bottom = [b + v for b, v in zip(bottom, vals)]
    itl = [(x, lv.client.tpot_ms_p50) for x, lv in zip(xs, levels) if lv.client and lv.client.tpot_ms_p50 is not None]
    if itl:
        ax.plot([p[0] + 0.33 for p in itl], [p[1] for p in itl], "k^", ms=4, mfc="white", label="client TPOT p50")
    ax.set_xticks(xs, [f"C={lv.concurrency}" + (f" r{lv.repeat}" if lv.repeat else "") for lv in levels])
    ax.set_ylabel("ms per token")
    steps = [f"C={lv.concurrency}" for lv, step in zip(levels, per_step) if step and lv.spec_decode is not None]
    spec = any(lv.spec_decode is not None for lv in levels)
    ax.set_title(
        "engine per-token time, split (bar top = engine ms per token"
        + ("; speculative decoding: per token emitted" if spec else "")
        + (f", per engine step at {', '.join(steps)}" if steps else "")
        + ") beside the client's TPOT p50",
        pad=14,
    )
    ax.legend(fontsize=6, frameon=False, ncol=6, loc="lower center", bbox_to_anchor=(0.5, 0.98))
    ax.set_ylim(0, max(bottom + [p[1] for p in itl]) * 1.25 or 1)
    return fig


def fig_timeline(tl: Timeline) -> Figure | None:
    ranks = tl.ranks
    if not ranks:
        return None
    fig = Figure(figsize=(WIDTH_IN, 0.7 + 0.45 * len(ranks)))
    ax = fig.add_subplot()
    for i, r in enumerate(ranks):
        if r["step_span_us"]:
            a, b = r["step_span_us"]
            ax.barh(i, b - a, left=a, height=0.7, color="#DDDDDD", edgecolor="#999999", lw=0.5)
        for k in r["calls"]:
            ax.barh(
                i,
                max(k["end_us"] - k["start_us"], 0.5),
                left=k["start_us"],
                height=0.5,
                color=COLORS["transfer"] if k["op"] == "all_reduce" else "#55A868",
            )
    ax.set_yticks(range(len(ranks)), [f"rank {r['rank']}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("us since the first rank entered the step (grey: step; orange: all-reduce; green: other collectives)")
    ax.grid(False, axis="y")
    return fig


def fig_what_if(w: WhatIfSection) -> Figure | None:
    rows = [r for r in w.rows if r.tok_per_s is not None]
    if not rows:
        return None
    fig = Figure(figsize=(WIDTH_IN, 0.8 + 0.28 * len(rows)))
    ax = fig.add_subplot()
    ys = list(range(len(rows)))
    ax.barh(ys, [r.tok_per_s for r in rows], color="#4C72B0", height=0.6)
    rg = [(y, r.tok_per_s_range) for y, r in zip(ys, rows) if r.tok_per_s_range]
    if rg:  # the range over the stated inputs, beside the central value
        ax.errorbar(
            [r["central"] for _, r in rg],
            [y for y, _ in rg],
            fmt="none",
            ecolor="k",
            elinewidth=0.8,
            capsize=2,
            xerr=[[r["central"] - r["low"] for _, r in rg], [r["high"] - r["central"] for _, r in rg]],
        )
    for y, r in zip(ys, rows):
        top = (r.tok_per_s_range or {}).get("high", r.tok_per_s)
        ax.text(top, y, f" {r.tok_per_s:.3g}", va="center", fontsize=7)
    if w.baseline_tok_per_s:
        ax.axvline(w.baseline_tok_per_s, color="k", ls="--", lw=0.8, label=f"baseline {w.baseline_tok_per_s:.3g} tok/s")
        ax.legend(fontsize=7, frameon=False, loc="lower right", bbox_to_anchor=(1.0, 1.0))
    ax.set_yticks(ys, [r.name for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel(
        "single-stream tok/s (model-based): bar = central value"
        + ("; whiskers = range over the stated inputs" if rg else "")
    )
    ax.set_xlim(0, max((r.tok_per_s_range or {}).get("high", r.tok_per_s) for r in rows) * 1.15)
    ax.grid(False, axis="y")
    return fig


def fig_predict_range(w: WhatIfSection) -> Figure | None:
    """Model-based ms per token per term: central bar, low-high whisker over the stated input ranges."""
    s1 = w.range.get("single_stream") or {}
    terms = s1.get("breakdown_ms") or {}
    if not terms:
        return None
    names = list(terms)
    fig = Figure(figsize=(WIDTH_IN, 0.9 + 0.3 * len(names)))
    ax = fig.add_subplot()
    ys = list(range(len(names)))
    c = [terms[k]["central"] for k in names]
    ax.barh(ys, c, color=[COLORS.get(k, "#8172B3") for k in names], height=0.6)
    ax.errorbar(
        c,
        ys,
        xerr=[
            [terms[k]["central"] - terms[k]["low"] for k in names],
            [terms[k]["high"] - terms[k]["central"] for k in names],
        ],
        fmt="none",
        ecolor="k",
        elinewidth=0.8,
        capsize=2,
    )
    sh = s1.get("share") or {}
    ax.set_yticks(ys, [f"{k} ({100 * sh[k]['low']:.0f}-{100 * sh[k]['high']:.0f}%)" if k in sh else k for k in names])
    ax.invert_yaxis()
    t, m = s1["tok_per_s"], s1["ms_per_token"]
    ax.set_xlabel(
        f"ms per token (model-based): total {m['central']:.3g} ms, {m['low']:.3g}-{m['high']:.3g}; "
        f"{t['central']:.3g} tok/s, {t['low']:.3g}-{t['high']:.3g} (share of a token in brackets)"
    )
    ax.grid(False, axis="y")
    return fig


def fig_ladder(ladder: LadderSection) -> Figure | None:
    rows = [r for r in ladder.levels if r.output_tok_per_s is not None]
    if len({r.concurrency for r in rows}) < 2:
        return None
    fig = Figure(figsize=(WIDTH_IN, 2.3))
    ax = fig.add_subplot()
    ax.plot(
        [r.concurrency for r in rows],
        [r.output_tok_per_s for r in rows],
        "o",
        ms=3,
        color="#4C72B0",
        label="output tok/s (each repeat)",
    )
    ax.set_xlabel("concurrency")
    ax.set_ylabel("output tok/s")
    ax.set_xscale("log", base=2)
    cs = sorted({r.concurrency for r in rows})
    ax.set_xticks(cs, [str(c) for c in cs])
    ax.minorticks_off()
    tp = [r for r in rows if r.tpot_ms_p50 is not None]
    if tp:
        ax2 = ax.twinx()
        ax2.plot(
            [r.concurrency for r in tp],
            [r.tpot_ms_p50 for r in tp],
            "s",
            ms=3,
            color="#C44E52",
            label="TPOT p50 (ms)",
        )
        ax2.set_ylabel("TPOT p50 (ms)")
        ax2.grid(False)
        ax2.legend(fontsize=6, frameon=False, loc="lower right")
    ax.legend(fontsize=6, frameon=False, loc="upper left")
    return fig


ALL = {
    "token_split": ("verdict", fig_token_split),
    "probe": ("probe", fig_probe),
    "breakdown": ("breakdown", fig_breakdown),
    "timeline": ("timeline", fig_timeline),
    "ladder": ("ladder", fig_ladder),
    "what_if": ("what_if", fig_what_if),
    "predict_range": ("what_if", fig_predict_range),
}
