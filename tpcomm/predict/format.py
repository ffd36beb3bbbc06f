"""Human-readable predict output: every number beside its range and conditions."""

from __future__ import annotations

from tpcomm.table import render


def _r(sp: dict, f: str = ".1f") -> str:
    return f"{sp['low']:{f}}-{sp['high']:{f}}"


def _header(doc: dict, kind: str) -> list[str]:
    hw, lay = doc["hardware"], doc["layout"]
    link = hw["link"]
    return [
        f"{kind}: {doc['model']['name']} ({doc['model']['quantization']})",
        f"on {lay['world_size']}x {hw['name']} ({hw['memory_bandwidth_GBps']} GB/s, link {link['type']}"
        f"{' P2P' if link.get('p2p') else ' no-P2P'} {link.get('nvlink_GBps') or link['p2p_GBps']} GB/s), TP={lay['tp']} PP={lay['pp']}"
        f"{' EP' if lay['ep'] else ''}, decode, context {doc['conditions']['context_tokens']}",
    ]


def format_predict(doc: dict) -> str:
    ss, ce, rg = doc["single_stream"], doc["ceilings"], doc["range"]
    inp, s1 = rg["inputs"], rg["single_stream"]
    fit1 = next(
        (b["fitted_to_tok_per_s"] for b in doc["batches"] if b["batch"] == 1 and b.get("fitted_to_tok_per_s")), None
    )
    mem = doc.get("memory") or {}
    first = [mem["statement"]] if mem.get("fits_90pct") is False or mem.get("warning") else []
    lines = (
        first
        + _header(doc, "MODEL-BASED PREDICTION (not a measurement)")
        + [
            f"engine {doc['conditions']['engine']}",
            *_coverage_line(doc),
            "collective latency per call (range; the kernel the engine picks: "
            f"{doc.get('collective_latency_kernel') or 'n/a'}):",
            *[f"  {lv:<7} {inp['collective_latency'][lv]}" for lv in ("low", "central", "high")],
            "kernel costs: " + "; ".join(_inputs_line(inp)),
            "",
            _single_stream_line(ss, s1, fit1),
        ]
    )
    rows = [
        [
            k,
            f"{v:.2f}",
            _r(s1["breakdown_ms"][k], ".2f"),
            f"{100 * v / ss['ms_per_token']:.0f}%",
            f"{100 * s1['share'][k]['low']:.0f}-{100 * s1['share'][k]['high']:.0f}%",
        ]
        for k, v in ss["breakdown_ms"].items()
    ]
    lines.append(render(["term", "ms/token", "range", "share", "share range"], rows, "lrrrr"))
    lines += ["", "verdict (model-based): " + rg["verdict"]["statement"], rg["bounds"]["statement"]]
    comm = ce["comm_only_tok_per_s"]
    lines += [
        "",
        f"interconnect at the central values (if it fit): {ss['collectives_per_token']} collectives per token, "
        f"{ss['breakdown_ms']['collectives']:.2f} ms = {100 * ce['interconnect_share_of_token']:.0f}% of each token"
        if ss["tok_per_s"] is None
        else f"interconnect at the central values: {ss['collectives_per_token']} collectives per token, {ss['breakdown_ms']['collectives']:.2f} ms = "
        f"{100 * ce['interconnect_share_of_token']:.0f}% of each token; ceilings comm-only {comm:.0f} tok/s, compute-only "
        f"{ce['compute_only_tok_per_s']:.1f} tok/s"
        if comm
        else f"no collectives at this layout; compute-only ceiling {ce['compute_only_tok_per_s']:.1f} tok/s (central)",
    ]
    if len(doc["batches"]) > 1:
        lines += [
            "",
            "batched decode (throughput, central and range):",
            render(
                [
                    "batch",
                    "step ms",
                    "tok/s",
                    "tok/s range",
                    "bound",
                    "weights",
                    "kv",
                    "collectives",
                    "overhead",
                    "extra",
                    "note",
                ],
                [
                    [b["batch"], f"{b['step_ms']:.2f}"]
                    + (["-", "-"] if b["tok_per_s"] is None else [f"{b['tok_per_s']:.1f}", _r(b["tok_per_s_range"])])
                    + [b["bound"]]
                    + [
                        f"{x:.2f}"
                        for x in (
                            b["breakdown_ms"]["weights"],
                            b["breakdown_ms"]["kv_cache"],
                            b["breakdown_ms"]["collectives"],
                            b["breakdown_ms"]["overhead"],
                            sum(
                                v
                                for k, v in b["breakdown_ms"].items()
                                if k not in ("weights", "kv_cache", "collectives", "overhead")
                            ),
                        )
                    ]
                    + [f"fitted to {b['fitted_to_tok_per_s']:g}" if b.get("fitted_to_tok_per_s") else ""]
                    for b in doc["batches"]
                ],
                "rrrrlrrrrrl",
            ),
        ]
    if doc.get("what_if"):
        lines += [
            "",
            "what if (single stream; range over the same inputs, change computed corner by corner):",
            _what_if_table(doc["what_if"]),
        ]
    if doc.get("compare"):
        lines += ["", "compare: " + doc["compare"]["conclusion"]]
    lines += ["", "assumptions:"] + [f"  - {a}" for a in doc["assumptions"]]
    return "\n".join(lines)


def _coverage_line(doc: dict) -> list[str]:
    """Said only where no row that informed the constants in use ran this engine (and what that widened)."""
    cov = doc.get("coverage")
    return [cov["statement"]] if cov and not cov["covered"] else []


def _single_stream_line(ss: dict, s1: dict, fit1) -> str:
    if ss["tok_per_s"] is None:
        return (
            f"single stream: no tok/s (the weights do not fit); if they did: {ss['ms_per_token']:.2f} ms/token, "
            f"{_r(s1['ms_per_token'], '.2f')} over the stated ranges ({ss['bound']}-bound)"
        )
    return (
        f"single stream: {ss['tok_per_s']:.1f} tok/s central, {_r(s1['tok_per_s'])} tok/s over the stated ranges "
        f"({ss['ms_per_token']:.2f} ms/token, {_r(s1['ms_per_token'], '.2f')}; {ss['bound']}-bound)"
        + (
            f"; the extra terms were fitted to the measured {fit1:g} tok/s here: this reproduces the fit, it is not a prediction of it"
            if fit1
            else ""
        )
    )


def _inputs_line(inp: dict) -> list[str]:
    names = {
        "memory_efficiency": ("memory efficiency", ""),
        "kv_efficiency": ("KV efficiency", ""),
        "quant_kernel_factor": ("quantized-GEMM factor", ""),
        "ramp_us": ("GEMM ramp", " us"),
        "kernel_overhead_us": ("launch gap", " us"),
        "moe_layer_us": ("MoE fixed", " us/layer"),
        "launch_us": ("eager launch", " us/kernel"),
    }
    out = [
        f"{label} {_r(inp[key], 'g')}{unit} (central {inp[key]['central']:g})"
        for key, (label, unit) in names.items()
        if inp.get(key)
    ]
    moe = inp.get("moe_layer_us") or {}
    if moe.get("covered_by_a_measurement") is False:
        out.append(f"MoE path '{moe.get('backend')}': no public measurement covers this engine version (range widened)")
    return out


def _what_if_table(rows: list[dict]) -> str:
    def chg(w):
        d = w.get("delta_pct_range")
        return f"{d['low']:+.0f}..{d['high']:+.0f}%" if d else "-"

    return render(
        ["scenario", "tok/s", "range", "change", "change range", "lever", "description"],
        [
            [
                w["name"],
                "-" if w["tok_per_s"] is None else f"{w['tok_per_s']:.1f}",
                _r(w["tok_per_s_range"]) if w.get("tok_per_s_range") else "-",
                "-" if w["delta_pct"] is None else f"{w['delta_pct']:+.0f}%",
                chg(w),
                "-" if w.get("lever") is None else ("yes" if w["lever"] else "no"),
                w["description"] + (f" [{w['lever_note']}]" if w.get("lever_note") else ""),
            ]
            for w in rows
        ],
        "lrrrrll",
    )


def format_calibrated(doc: dict) -> str:
    ss, cal = doc["single_stream"], doc["calibration"]
    lines = _header(doc, "MODEL ANCHORED ON A MEASURED RUN") + [
        f"measured terms from {cal['run_dir']}/attribution/summary.json at concurrency {cal['concurrency']} "
        f"(keys read: {', '.join(cal['keys_read'])}); {cal['conditions']}",
        "",
        f"measured configuration: {ss['tok_per_s']:.1f} tok/s ({ss['ms_per_token']:.3f} ms/token), "
        f"{cal['reproduces_pct']:+.1f}% against the run's own per-token time ({cal['measured_from']}, {cal['measured_ms_per_token']:.3f} ms)",
        render(
            ["term", "ms/token", "share"],
            [[k, f"{v:.3f}", f"{100 * v / ss['ms_per_token']:.0f}%"] for k, v in ss["breakdown_ms"].items()],
            "lrr",
        ),
    ]
    if doc.get("what_if"):
        lines += [
            "",
            "what if (measured terms kept, the changed part modelled; range over the model's inputs):",
            _what_if_table(doc["what_if"]),
        ]
    lines += ["", "assumptions:"] + [f"  - {a}" for a in doc["assumptions"]]
    return "\n".join(lines)
