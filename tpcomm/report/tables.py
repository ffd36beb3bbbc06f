"""The report's content as blocks (text, table, figure), shared by the PDF and
the Markdown renderers so both say the same thing. Only formatting happens
here; the numbers come from analysis.py.
"""

from __future__ import annotations

from typing import Any

from tpcomm import columns as K
from tpcomm.columns import fmt
from tpcomm.report.sections import (
    BreakdownSection,
    LadderSection,
    MethodsSection,
    PageOne,
    PlanSection,
    ProbeSection,
    SystemSection,
    WhatIfSection,
)
from tpcomm.rundir.documents import Timeline

# ("text", str) | ("small", str) | ("headline", str) | ("warning", str) | ("table", (header, rows, widths))
# | ("figure", key, caption)
Block = tuple


def title(report) -> str:
    plan: PlanSection = report["plan"].data
    pred: WhatIfSection = report["what_if"].data
    model = plan.served_name or (plan.model.name if plan.model else None) or pred.model_name
    tp = (plan.layout.tp if plan.layout else None) or pred.tp
    src = report.verdict.source
    return (
        "tpcomm report" + (f": {model}" if model else "") + (f", TP {tp}" if tp else "") + (f" ({src})" if src else "")
    )


def page_one_blocks(d: PageOne) -> list[Block]:
    """Page one: the headline, the bar of where each token goes, the verdict (at most three sentences), the
    levers with what to set, and one line defining each term used (first_page.py holds the data)."""
    out: list[Block] = []
    if d.warning:
        out.append(("warning", d.warning))
    if d.headline:
        out.append(("headline", d.headline))
    if d.conditions:
        out.append(("small", "Conditions: " + d.conditions))
    if d.split:
        out.append(("figure", "token_split", ""))
    if d.definitions:  # one line per term the page uses, right under the bar that uses them
        rows = [x.split(": ", 1) for x in d.definitions]
        out.append(("table", (["term", "what it is"], rows, [0.8, 6])))
    if d.five:  # the token as the client saw it: the four terms + delivery (first_page.five_terms_table)
        out.append(("table", d.five))
    out += [("text", x) for x in d.sentences[:3]]
    if d.levers:
        out.append(("table", K.table(K.LEVERS, d.levers)))
    for b in d.bounds:
        out.append(
            (
                "small",
                f"Bound: at most {fmt(b.tok_per_s)} tok/s ({K.signed_pct(b.change_pct)}) if collectives cost nothing.",
            )
        )
    if d.levers_note:
        out.append(("small", d.levers_note))
    return out


def _b(n: Any) -> str:
    """Bytes in decimal units (GB = 1e9, as nccl-tests and `tpcomm plan` print them), exact below 1 kB."""
    if n is None:
        return "n/a"
    n = float(n)
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= k:
            return f"{n / k:.3g} {unit}"
    return f"{n:.0f} B"


def _pct(x: float | None) -> str:
    return K.signed_pct(x)


def section_blocks(sec) -> list[Block]:
    from tpcomm.report.replay import blocks as _replay

    return {
        "system": _system,
        "plan": _plan,
        "probe": _probe,
        "breakdown": _breakdown,
        "replay": _replay,
        "timeline": _timeline,
        "ladder": _ladder,
        "what_if": _what_if,
        "methods": _methods,
    }[sec.key](sec.data)


def _system(d: SystemSection) -> list[Block]:
    out: list[Block] = []
    topo = d.topo
    if topo.get("scalars"):
        out.append(("table", (["machine", "value"], [[k, v] for k, v in topo["scalars"].items()], [1, 4])))
    if topo.get("gpus"):
        keys = ["index", "name", "cc", "pcie", "numa_node", "nvlinks_up", "pci_bus_id"]
        out.append(
            ("table", (keys, [[g.get(k, "") for k in keys] for g in topo["gpus"]], [0.5, 2, 0.5, 2, 0.7, 0.7, 1.5]))
        )
    if topo.get("topology"):
        n = len(topo["topology"])
        out.append(("text", "GPU-to-GPU path (NVML common ancestor):"))
        out.append(
            (
                "table",
                (
                    [""] + [f"GPU{j}" for j in range(n)],
                    [[f"GPU{i}", *row] for i, row in enumerate(topo["topology"])],
                    [1] * (n + 1),
                ),
            )
        )
    if topo.get("paths"):
        out.append(
            (
                "text",
                f"vLLM all-reduce paths on this {topo.get('platform') or 'machine'}, in the order vLLM tries them:",
            )
        )
        out.append(
            (
                "table",
                (
                    ["path", "eligible", "why", "lever"],
                    [
                        [p.get("path"), "yes" if p.get("eligible") else "no", p.get("why", ""), p.get("lever") or ""]
                        for p in topo["paths"]
                    ],
                    [1.2, 0.6, 4, 2],
                ),
            )
        )
    if topo.get("findings"):
        out.append(("text", "Topology findings:"))
        out.append(
            (
                "table",
                (
                    ["finding", "kind", "lever"],
                    [[f["text"], f.get("severity") or "", f.get("lever") or ""] for f in topo["findings"]],
                    [5, 0.8, 3],
                ),
            )
        )
    if topo:
        env = topo.get("nccl_env") or {}
        out.append(
            (
                "text",
                "NCCL / vLLM environment: "
                + (
                    ", ".join(f"{k}={v}" for k, v in env.items())
                    if env
                    else "no NCCL_* / VLLM_* setting in effect (defaults)."
                ),
            )
        )
    if d.nodes:
        hosts = {(n or {}).get("boot_id") or (n or {}).get("host") for _, n, _ in d.nodes}
        out.append(
            (
                "text",
                f"The ranks' machines ({len(hosts)} machine(s), from the hook's status) and their clocks, put on rank "
                "0's from the collectives' exit times (the split uses durations and needs no common clock):",
            )
        )
        out.append(("table", K.table(K.NODES, d.nodes)))
    if d.versions:
        out.append(("table", (["software", "version"], [list(r) for r in d.versions], [1, 3])))
    if d.serving:
        out.append(("table", (["serving / load setting", "value"], [list(r) for r in d.serving], [1, 3])))
    if d.stages:
        out.append(("text", "Stages: " + ", ".join(f"{k} {v}" for k, v in d.stages.items())))
    return out


def _plan(d: PlanSection) -> list[Block]:
    m, pt = d.model, d.per_token
    out: list[Block] = [
        (
            "text",
            f"Model {d.served_name or m.name}: {m.architecture or '?'}, hidden {m.hidden_size or '?'}, "
            f"{m.num_layers or '?'} layers. Per decode step at batch 1: {fmt(pt.get('count'))} collectives per rank, "
            f"{_b(pt.get('bytes'))} sent per rank in total.",
        )
    ]
    # A plan over several batch sizes repeats every site per batch: the table shows the smallest batch.
    batches = sorted({c.batch for c in d.collectives if c.batch is not None})
    shown = [c for c in d.collectives if not batches or c.batch == batches[0]]
    rows = [[c.op, c.group, _b(c.bytes), c.count, c.batch, c.dtype, c.site] for c in shown]
    out.append(
        (
            "table",
            (
                ["op", "group", "bytes/rank/call", "count/step", "batch", "dtype", "site"],
                rows,
                [1.2, 0.6, 1, 0.8, 0.5, 0.7, 3],
            ),
        )
    )
    if len(batches) > 1:
        out.append(
            (
                "text",
                f"Batches {', '.join(map(str, batches[1:]))}: the same calls at the sizes of those batches (plan.json lists every row).",
            )
        )
    w = d.weights
    if w.get("components"):
        out.append(
            (
                "text",
                f"Weight bytes each GPU reads per decode step at batch {w.get('batch')}: {_b(w.get('total_bytes'))}.",
            )
        )
        out.append(
            (
                "table",
                (
                    ["component", "sharding", "bits/weight", "bytes per GPU"],
                    [
                        [c.get("component"), c.get("sharding"), c.get("bits_per_weight"), _b(c.get("bytes_per_gpu"))]
                        for c in w["components"]
                    ],
                    [3, 1, 0.8, 1],
                ),
            )
        )
    return out


def _probe(d: ProbeSection) -> list[Block]:
    out: list[Block] = [
        (
            "figure",
            "probe",
            "Collective time per call (p50) and bus bandwidth vs message size, per backend and op; "
            "dotted lines mark the model's message sizes.",
        )
    ]
    rows = d.rows
    sizes = {m["bytes"] for m in d.model_sizes}
    shown = [r for r in rows if r["bytes"] in sizes] or rows
    # One row per (backend, op, mode, size): isolated (what a decode step sees) beside pipelined (nccl-tests style).
    merged: dict[tuple, dict] = {}
    for r in shown:
        key = (r.get("backend", ""), r.get("op", ""), r.get("mode", ""), r["bytes"])
        merged.setdefault(key, {})[r.get("timing") or "isolated"] = r
    table = []
    for (backend, op, mode, nbytes), by in merged.items():
        iso, pipe = by.get("isolated") or next(iter(by.values())), by.get("pipelined")
        wrong = [x.get("wrong") for x in by.values() if x.get("wrong") is not None]
        table.append(
            [
                backend,
                op,
                mode,
                nbytes,
                fmt(iso["time_us_p50"]),
                fmt(iso.get("time_us_p99")),
                fmt(pipe["time_us_p50"]) if pipe else "n/a",
                fmt(iso.get("busbw_GBps")),
                fmt(pipe.get("busbw_GBps")) if pipe else "n/a",
                sum(wrong) if wrong else "n/a",
            ]
        )
    out.append(("text", "At the model's sizes:" if shown is not rows else "All measured sizes:"))
    out.append(
        (
            "table",
            (
                [
                    "backend",
                    "op",
                    "mode",
                    "bytes",
                    "isolated p50 us",
                    "isolated p99 us",
                    "pipelined p50 us",
                    "busbw GB/s (isolated)",
                    "busbw GB/s (pipelined)",
                    "wrong",
                ],
                table,
                [0.8, 1, 0.6, 0.7, 0.9, 0.9, 0.9, 0.9, 0.9, 0.6],
            ),
        )
    )
    if d.fit:
        keys = ["backend", "op", "mode", "timing", "bytes", "alpha_us", "beta_GBps", "points", "max_rel_err"]
        out.append(
            (
                "text",
                "Fitted latency model (probe/fit.json" + (f"; {d.fit_formula}" if d.fit_formula else "") + "):",
            )
        )
        out.append(
            (
                "table",
                (
                    keys,
                    [
                        [
                            fmt(r.get(k)) if isinstance(r.get(k), float) else ("n/a" if r.get(k) is None else r.get(k))
                            for k in keys
                        ]
                        for r in d.fit
                    ],
                    [0.8, 1, 0.7, 0.9, 1.2, 0.8, 0.8, 0.6, 0.9],
                ),
            )
        )
    return out


def _breakdown(d: BreakdownSection) -> list[Block]:
    out: list[Block] = [
        (
            "figure",
            "breakdown",
            "Engine per-token time per concurrency level, stacked: compute + collective "
            "transfer + collective wait (rank skew) + host gap between steps = the bar's top; "
            "the client's TPOT p50 beside it (not part of the split).",
        )
    ]
    levels = d.levels
    out.append(("table", K.table(K.SPLIT, levels)))
    out += [("text", f"{x}.") for x in d.closure_failed]
    out += [("text", x) for x in d.notes]
    if d.excluded:
        out.append(("text", "Compared on neither side of the closure: " + "; ".join(d.excluded) + "."))
    inst = d.instruments
    if inst and inst.get("terms"):
        out.append(
            (
                "text",
                "The same split from the server's torch-profiler traces (a second instrument, tpcomm/trace), on the "
                f"same window as the hook's ({inst.get('window_text', '')}):",
            )
        )
        out.append(("table", K.table(K.INSTRUMENTS, inst["terms"])))
    ranks = [(lv.concurrency, r) for lv in levels for r in lv.by_rank]
    if ranks:
        out.append(("text", "The same split per rank (each rank's terms add up to its own mean decode-step period):"))
        out.append(("table", K.table(K.BY_RANK, ranks)))
    out += [("small", x) for x in d.definitions]
    return out


def _timeline(d: Timeline) -> list[Block]:
    txt = (
        f"Decode step {d.step}"
        + (f" ({d.num_seqs} sequence(s))" if d.num_seqs is not None else "")
        + f": {d.n_collectives} collectives per rank; step {fmt(d.step_us)} us across ranks; largest entry skew "
        f"{fmt(d.max_entry_skew_us)} us, summed over the step's collectives {fmt(d.sum_entry_skew_us)} us."
        + (
            f" Ranks on other clocks were put on rank 0's to within {fmt(d.clock_uncertainty_us)} us: an entry "
            "skew smaller than that does not tell which rank arrived last."
            if d.clock_uncertainty_us is not None
            else ""
        )
    )
    rows = [
        [
            r["rank"],
            fmt((r["step_span_us"][1] - r["step_span_us"][0]) if r["step_span_us"] else None),
            len(r["calls"]),
            fmt(r["collective_us"]),
        ]
        for r in d.ranks
    ]
    return [
        ("figure", "timeline", "One decode step per rank: grey the step, coloured each collective call."),
        ("text", txt),
        ("table", (["rank", "step us", "collectives", "time in collectives us"], rows, [1, 1, 1, 1.5])),
    ]


def _ladder(d: LadderSection) -> list[Block]:
    out: list[Block] = [
        (
            "figure",
            "ladder",
            "Output throughput (left axis) and TPOT p50 (right axis) vs concurrency, each repeat shown.",
        ),
        ("table", K.table(K.LOAD, d.levels)),
    ]
    for r in d.levels:
        for f in r.flags or []:
            out.append(("text", f"C={r.concurrency} repeat {r.repeat}: {f}"))
    if d.flagged:
        out.append(
            (
                "text",
                f"{len(d.flagged)} level(s) flagged as unsteady or not repeatable: read their numbers with care.",
            )
        )
    return out


def _what_if(d: WhatIfSection) -> list[Block]:
    out: list[Block] = [
        (
            "figure",
            "what_if",
            "Predicted single-stream tok/s per what-if (model-based, not measured); "
            "whiskers: the range over the stated inputs.",
        )
    ]
    rg = d.range
    br = d.breakdown_ms
    s1 = rg.get("single_stream") or {}
    if s1:
        out.append(
            (
                "figure",
                "predict_range",
                "Model-based ms per token per term at the central inputs; whiskers: low-high over the "
                "stated input ranges (collective latency, per-kernel overhead, memory efficiency).",
            )
        )
    if br:
        t = s1.get("tok_per_s")
        out.append(
            (
                "text",
                f"Baseline {fmt(d.baseline_tok_per_s)} tok/s ({fmt(d.baseline_ms_per_token)} ms per token)"
                + (f", range {fmt(t['low'])}-{fmt(t['high'])} tok/s over the stated inputs" if t else "")
                + ": "
                + ", ".join(
                    f"{k} {fmt(v)} ms"
                    + (
                        f" ({fmt(s1['breakdown_ms'][k]['low'])}-{fmt(s1['breakdown_ms'][k]['high'])})"
                        if k in s1.get("breakdown_ms", {})
                        else ""
                    )
                    for k, v in br.items()
                    if isinstance(v, (int, float))
                )
                + ".",
            )
        )
    inp = rg.get("inputs") or {}
    if inp:
        rows = [
            [f"collective latency {lv}", inp["collective_latency"].get(lv, "")] for lv in ("low", "central", "high")
        ]
        for key, unit in (("kernel_overhead_us", " us"), ("memory_efficiency", "")):
            x = inp[key]
            rows.append(
                [
                    key.replace("_", " "),
                    f"{fmt(x['low'])}-{fmt(x['high'])}{unit}, central {fmt(x['central'])}{unit}: {x['source']}",
                ]
            )
        for text in d.fitted:
            rows.append(["fitted term", text])
        out.append(("table", (["uncertain input", "range and source"], rows, [1.3, 5])))
    for key in ("verdict", "bounds"):
        if (rg.get(key) or {}).get("statement"):
            out.append(("text", ("Model-based verdict: " if key == "verdict" else "") + rg[key]["statement"]))
    if d.calibration:
        c = d.calibration
        out.append(
            (
                "text",
                f"Anchored on the measured run {c['run_dir']} (concurrency {c['concurrency']}; read {', '.join(c['keys_read'])}): "
                f"the measured configuration reproduces its own per-token time within {fmt(abs(c['reproduces_pct']))}%.",
            )
        )
    rr = lambda r: f"{fmt(r['low'])}-{fmt(r['high'])}" if r else ""
    out.append(
        (
            "table",
            (
                ["what-if", "description", "tok/s", "range", "ms/token", "change", "change range"],
                [
                    [
                        r.name,
                        r.description,
                        fmt(r.tok_per_s),
                        rr(r.tok_per_s_range),
                        fmt(r.ms_per_token),
                        _pct(r.change_pct),
                        (
                            f"{_pct(r.change_pct_range['low'])} to {_pct(r.change_pct_range['high'])}"
                            if r.change_pct_range
                            else ""
                        ),
                    ]
                    for r in d.rows
                ],
                [1.5, 3.6, 0.6, 0.9, 0.7, 0.6, 1.0],
            ),
        )
    )
    c = d.compare
    if c and c.get("models"):
        rows = [
            ["quantization", *c.get("quantization", ["?"] * len(c["models"]))],
            ["weight bytes per GPU per token", *[_b(x) for x in c.get("weight_bytes_per_gpu", [])]],
            ["predicted tok/s (central)", *[fmt(x) for x in c.get("predicted_tok_per_s", [])]],
        ]
        if c.get("measured_tok_per_s"):
            rows.append(["measured tok/s (given by the user)", *[fmt(x) for x in c["measured_tok_per_s"]]])
        out.append(
            (
                "text",
                "Checkpoint comparison: same collectives: "
                + ("yes" if c.get("same_collectives") else "NO")
                + "; same weight bytes: "
                + ("yes" if c.get("same_weight_bytes") else "NO")
                + ".",
            )
        )
        out.append(("table", (["", *c["models"]], rows, [1.5] + [2] * len(c["models"]))))
    if d.batches:
        out.append(
            (
                "text",
                "Predicted decode step time per batch size (central, and tok/s over the stated input ranges); a row "
                "marked fitted reproduces the measurement the extra terms were fitted to and is not a prediction:",
            )
        )
        out.append(
            (
                "table",
                (
                    ["batch", "step ms", "tok/s", "tok/s range", "note"],
                    [
                        [
                            b.get("batch"),
                            fmt(b.get("step_ms")),
                            fmt(b.get("tok_per_s")),
                            rr(b.get("tok_per_s_range")),
                            f"fitted to the measured {fmt(b['fitted_to_tok_per_s'])} tok/s"
                            if b.get("fitted_to_tok_per_s")
                            else "",
                        ]
                        for b in d.batches
                    ],
                    [0.7, 1, 1, 1.3, 2],
                ),
            )
        )
    return out


def _methods(d: MethodsSection) -> list[Block]:
    out: list[Block] = [
        (
            "table",
            (
                ["number", "how it was measured or derived"],
                [[i.what, i.how] for i in d.items],
                [1.2, 5],
            ),
        )
    ]
    out.append(("text", "Files in this run directory: " + ", ".join(d.files) + "."))
    if d.commands:
        out.append(("text", "Commands that wrote this run directory (meta.json):"))
        out.append(
            (
                "table",
                (
                    ["UTC", "command", "command line"],
                    [[c.utc, c.command, c.argv] for c in d.commands],
                    [1.3, 0.8, 5],
                ),
            )
        )
    return out
