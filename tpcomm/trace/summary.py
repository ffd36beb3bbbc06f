"""trace/summary.json, written by one function (`write_summary`), and the
terminal tables for it and for the two instruments side by side."""

from __future__ import annotations

from tpcomm.analysis.levelsplit import level_split
from tpcomm.judge import bottleneck
from tpcomm.rundir import contract as C
from tpcomm.rundir.results import Attribution

SUMMARY_FORMAT = 1


def write_summary(rd, ts, split: dict, crosscheck: dict, ranks: list[dict], conditions: dict) -> dict:
    """The summary document of a trace import (`ts`: instances.TraceSet), written to trace/summary.json."""
    doc = {
        "source": "trace",
        "summary_format": SUMMARY_FORMAT,
        "timeline": ts.timeline,
        "step_source": sorted({t.step_source for t in ts.tables}),
        "files": {str(r): f for r, f in sorted(ts.files.items())},
        "world_size": ts.world_size,
        "hosts": ts.hosts,
        "subset": ts.subset,
        "split": split,
        "ranks": ranks,
        "collectives_per_step": crosscheck,
        "unclassified": {str(t.rank): t.unclassified for t in ts.tables if t.unclassified},
        "notes": list(ts.notes),
        "conditions": conditions,
    }
    rd.write_json(C.TRACE_SUMMARY, doc)
    return doc


def attribution(doc: dict) -> Attribution:
    """The trace import as the typed attribution summary (source "trace"), so `tpcomm report` renders a run
    directory that has traces and no hook exactly as it renders the hook's: one level, the traces' window.
    Traces carry no client timings: no client figures and no closure. The concurrency is the sequences
    per decode step the traces saw (rounded)."""
    sp = doc["split"]
    pt = sp.get("per_token_ms")
    split_ok = bool(pt) and pt.get("transfer") is not None and sp.get("unit") == "token"
    note = None if split_ok else (sp.get("note") or "no per-token split from these traces")
    lv = level_split(
        max(1, round(sp.get("seqs_per_step") or 1)),
        0,
        "trace",
        None,
        sp if split_ok else None,
        note,
        clock=sp.get("clock") or ("gpu" if doc["timeline"] == "device" else "host"),
        decode_pairs=int(sp.get("decode_pairs") or 0),
        sampled_pairs_share=sp.get("sampled_pairs_share"),
        seqs_per_step=sp.get("seqs_per_step"),
        steps_in_window=sp.get("steps_in_window") or {},
        ceilings_tok_per_s={},
        collectives_per_step=doc.get("collectives_per_step") or {},
    )
    terms = lv.per_token_ms
    cond = {**doc.get("conditions", {}), "source": "torch-profiler traces", "timeline": doc["timeline"]}
    return Attribution(
        source="trace",
        plugin=False,
        plugin_note=None,
        method="Kineto traces read into the hook's record tables (tpcomm/trace), aligned and split by the hook's own "
        "code (analysis/align.py, split.py): " + ", ".join(doc.get("step_source") or []),
        conditions=cond,
        plan_config={"source": None, "path": cond.get("model_config"), "text": None},
        windows=[],
        notes=list(doc.get("notes", [])),
        levels=[lv],
        verdict=bottleneck.measured(terms) if terms else None,
        headline={"concurrency": lv.concurrency, "repeat": 0} if terms else None,
    )


def _ms(v) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def split_lines(doc: dict) -> list[str]:
    sp = doc["split"]
    unit = sp.get("unit", "token")
    out = [
        f"Per-{unit} split from torch-profiler traces ({sp.get('clock', 'host')} clock, {doc['timeline']} timeline; steps: "
        f"{', '.join(doc['step_source'])}; ranks {', '.join(map(str, sorted(int(r) for r in doc['files'])))})"
    ]
    pt = sp.get("per_token_ms")
    if pt:
        terms = "  ".join(f"{k} {_ms(v)}" for k, v in pt.items())
        out.append(f"  engine ms/{unit} {_ms(sp['engine_ms_per_token'])} = {terms}  ({sp['decode_pairs']} pairs/rank)")
    else:
        out.append(f"  no split: {sp.get('note', 'no two consecutive steps')}")
    out.append(
        f"  {'rank':>4} {'steps':>6} {'span ms':>9} {'compute':>9} {'collective':>10} {'transfer':>9} "
        f"{'wait':>8} {'gap ms':>8} {'calls':>6}"
    )
    for r in doc["ranks"]:
        out.append(
            f"  {r['rank']:>4} {r['steps']:>6} {r['span_us'] / 1e3:>9.3f} {r['compute_us'] / 1e3:>9.3f} "
            f"{r['collective_us'] / 1e3:>10.3f} {r['transfer_us'] / 1e3:>9.3f} {r['wait_us'] / 1e3:>8.3f} "
            f"{r['gap_us'] / 1e3:>8.3f} {r['collectives']:>6}"
        )
    cc = doc.get("collectives_per_step") or {}
    if cc:
        out.append(f"  collectives per decode step: {cc.get('observed_total')} observed; {cc.get('detail')}")
    for rank, odd in (doc.get("unclassified") or {}).items():
        names = "; ".join(f"{u['name'][:80]} x{u['count']} ({u['time_us']:.0f} us)" for u in odd[:5])
        out.append(f"  rank {rank}: looks like communication, matches no rule (counted as compute): {names}")
    z = (doc.get("conditions") or {}).get("trace_size")
    if z:
        out.append(
            f"  traces: {z['files']} files, {z['bytes'] / 1e6:.1f} MB, {z['events']:,} events, "
            f"imported in {z['import_s']:.1f} s"
        )
    if sp.get("clock_note"):
        out.append(f"  clock: {sp['clock_note']}")
    out += [f"  note: {n}" for n in doc.get("notes", [])]
    return out


def compare_lines(cmp_doc: dict) -> list[str]:
    out = [f"Both instruments, one window ({cmp_doc.get('window_text', '')}): ms per token"]
    out.append(f"  {'term':>10} {'hook':>9} {'trace':>9} {'diff':>9} {'% of token':>10}")
    for t in cmp_doc["terms"]:
        pct = "n/a" if t["diff_pct_of_per_token"] is None else f"{t['diff_pct_of_per_token']:+.1f}%"
        diff = "n/a" if t["diff_ms"] is None else f"{t['diff_ms']:+.3f}"
        out.append(f"  {t['term']:>10} {_ms(t['hook_ms']):>9} {_ms(t['trace_ms']):>9} {diff:>9} {pct:>10}")
    return out
