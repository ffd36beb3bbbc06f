"""Page 1 of the report: the verdict in plain words, with its numbers.

Measured numbers come first (measured.py): the engine's per-token time at the
lowest concurrency and its four terms from the hook's records
(attribution/summary.json), the client's TPOT beside it; without hook records,
tok/s from the client's TPOT. Without a measurement, or
without the hook's split, the numbers come from `tpcomm predict` and say they
are model-based; with neither, the verdict says what is not measured. The levers are the
predict what-ifs and the topology findings, ranked by predicted effect, plus
two bounds that follow from the measurement itself (no rank skew, free
interconnect).

Units: *_ms milliseconds per token, *_us microseconds, tok/s per stream.
"""

from __future__ import annotations

from typing import Any

from tpcomm.report import measured, readers

# Shares of a token above which a term is called the bottleneck / a major part.
BOTTLENECK_SHARE = 0.5
MAJOR_SHARE = 0.25
# Measured compute this many times predict's weight streaming + per-kernel overhead = a slow kernel path.
SLOW_KERNEL_RATIO = 2.0
TOP_LEVERS = 5  # rows of the lever table on page 1; the what-if section lists them all


def fmt(x: float | None, digits: int = 3) -> str:
    """Numbers as the report prints them: ~3 significant digits, no exponent."""
    if x is None:
        return "n/a"
    if isinstance(x, int) or (
        isinstance(x, float) and x.is_integer() and abs(x) < 1e6 and not isinstance(x, bool) and abs(x) >= 10
    ):
        return f"{int(x)}"
    ax = abs(x)
    if ax >= 100 or ax == 0:
        return f"{x:.0f}"
    if ax >= 10:
        return f"{x:.1f}"
    if ax >= 1:
        return f"{x:.2f}"
    return f"{x:.{digits}f}"


def build_verdict(inp: readers.Inputs, cmds: dict[str, str], s):
    meas = _measured(inp)
    pred = _predicted(inp)
    d: dict[str, Any] = {"measured": meas, "predicted": pred, "numbers": {}, "sentences": [], "levers": []}
    s.data = d
    if meas is None and pred is None:
        s.missing("single-stream tok/s (measured)", cmds["attribute"])
        s.missing("single-stream tok/s (model-based)", cmds["predict"])
        d["sentences"].append("No measurement and no prediction in this run directory: nothing to conclude yet.")
        return s
    s.available = True
    head = meas or pred
    d["source"] = "measured" if meas else "model-based"
    num = d["numbers"]
    num["cap_tok_per_s"] = fmt(head["tok_per_s"])
    num["ms_per_token"] = fmt(head["ms_per_token"])
    sent = d["sentences"]
    if stopped := readers.incomplete_stages(inp):
        num["incomplete"] = ", ".join(stopped)
        sent.append(
            f"This run is INCOMPLETE: {num['incomplete']} (status.json); what follows is what was measured before that."
        )
    sent.append(
        f"Single-stream decode is capped at {num['cap_tok_per_s']} tok/s ({num['ms_per_token']} ms per token), "
        + (
            f"measured ({meas['cap_from']})."
            if meas
            else pred.get("headline_note") or "model-based (a prediction, not a measurement)."
        )
    )
    d["conditions"] = head["label"]
    s.conditions = head["label"]
    # Where each token goes: the measured split when the hook ran, else the model's, else nothing.
    split = meas if meas and meas["split"] else pred
    d["split"], d["split_source"] = split, (None if split is None else "measured" if split is meas else "model-based")
    if split is None:
        sent.append(
            f"How much of each token is interconnect: not measured ({readers.no_split_reason(inp)}), "
            "and there is no prediction to fall back to."
        )
        s.missing("per-token split (interconnect transfer / wait)", cmds["attribute_plugin"])
        s.missing("model-based split", cmds["predict"])
    elif split is meas:
        sent.extend(measured.sentences(meas, num, fmt))
        d["bottleneck"] = measured.bottleneck(meas, pred, fmt)
        sent.append(d["bottleneck"]["statement"])
    else:
        num["interconnect_ms"] = fmt(split["interconnect_ms"])
        num["interconnect_pct"] = fmt(split["interconnect_share"] * 100)
        num["collectives_per_token"] = fmt(split["collectives_per_token"])
        num["latency_us_each"] = fmt(split["latency_us_each"])
        ic = (
            f"Interconnect: {num['collectives_per_token']} collectives per token x {num['latency_us_each']} us each = "
            f"{num['interconnect_ms']} ms, {num['interconnect_pct']}% of each token"
        )
        if split is pred and meas:
            ic += f" (model-based: no measured split in this run: {readers.no_split_reason(inp)})"
        if split.get("transfer_ms") is not None:
            num["transfer_ms"] = fmt(split["transfer_ms"])
            num["wait_ms"] = fmt(split["wait_ms"])
            ic += f"; of that, transfer {num['transfer_ms']} ms and waiting for other ranks (skew) {num['wait_ms']} ms."
        else:
            ic += (
                "; transfer vs wait: not measured (needs tpcomm attribute against a server running the tpcomm plugin)."
            )
        if split.get("range_note"):
            ic += " " + split["range_note"]
        sent.append(ic)
        d["bottleneck"] = _bottleneck(split, pred if split is meas else None)
        sent.append(d["bottleneck"]["statement"])
    if meas and pred:
        num["predicted_tok_per_s"] = fmt(pred["tok_per_s"])
        gap = readers.pct_change(meas["tok_per_s"], pred["tok_per_s"])
        num["measured_vs_predicted_pct"] = fmt(abs(gap))
        sent.append(
            f"For comparison, the analytic model predicts {num['predicted_tok_per_s']} tok/s"
            + (pred.get("range_text") or "")
            + f"; the measurement is {num['measured_vs_predicted_pct']}% {'below' if gap < 0 else 'above'} its central value "
            f"({pred['label']})."
        )
    cmp_ = (inp.predict or {}).get("compare")
    if cmp_ and cmp_.get("conclusion"):
        d["compare"] = cmp_
        sent.append(
            "Checkpoint comparison (model-based"
            + (", measured tok/s as given by the user" if cmp_.get("measured_tok_per_s") else "")
            + "): "
            + cmp_["conclusion"]
        )
    if not meas:
        s.missing("measured single-stream tok/s and its split", cmds["attribute"])
    d["levers"] = _levers(inp, meas, pred)
    return s


def _measured(inp: readers.Inputs) -> dict[str, Any] | None:
    """The engine's per-token time and its split at the lowest concurrency, the client beside it (measured.py)."""
    return measured.measured(inp)


def _predicted(inp: readers.Inputs) -> dict[str, Any] | None:
    """predict.json's central values, its range over the uncertain inputs and the verdict that holds over all of it."""
    p = inp.predict
    ss = (p or {}).get("single_stream") or {}
    if not ss.get("tok_per_s"):
        return None
    br = dict(ss.get("breakdown_ms") or {})
    if p.get("calibration"):  # predict --attribution: the measured terms; collectives = transfer + wait
        br = {
            "compute": br.get("compute", 0.0),
            "collectives": br.get("transfer", 0.0) + br.get("wait", 0.0),
            "host": br.get("host", 0.0),
        }
    total = sum(v for v in br.values() if isinstance(v, (int, float)))
    ic = br.get("collectives") or 0.0
    n = ss.get("collectives_per_token")
    if not n and inp.plan:
        n = readers.plan_per_step(inp.plan, batch=1).get("count")
    rg = p.get("range") or {}
    tr = (rg.get("single_stream") or {}).get("tok_per_s")
    sh = (rg.get("verdict") or {}).get("share")
    fit = next(
        (
            b.get("fitted_to_tok_per_s")
            for b in p.get("batches") or []
            if b.get("batch") == 1 and b.get("fitted_to_tok_per_s")
        ),
        None,
    )
    out = {
        "tok_per_s": ss["tok_per_s"],
        "ms_per_token": ss.get("ms_per_token") or 1000.0 / ss["tok_per_s"],
        "terms": br,
        "interconnect_ms": ic,
        "interconnect_share": ic / total if total else 0.0,
        "transfer_ms": None,
        "wait_ms": None,
        "collectives_per_token": n,
        "latency_us_each": 1000.0 * ic / n if n else None,
        "weights_ms": br.get("weights"),
        "label": readers.predict_conditions(p),
        "hardware": (p.get("hardware") or {}).get("name"),
        "model_name": (p.get("model") or {}).get("name"),
        "tp": (p.get("layout") or {}).get("tp"),
        "range": rg or None,
        "range_verdict": rg.get("verdict"),
        "bounds": rg.get("bounds"),
    }
    if tr:
        out["range_text"] = (
            f" (central value; {fmt(tr['low'])}-{fmt(tr['high'])} tok/s over the model's stated input ranges)"
        )
        out["headline_note"] = (
            f"model-based (a prediction, not a measurement): the central value of a range of {fmt(tr['low'])}-"
            f"{fmt(tr['high'])} tok/s over the model's uncertain inputs (listed under Methods)."
        )
    if fit:
        out["headline_note"] = (
            f"model-based, with extra terms fitted to the measured {fmt(fit)} tok/s at this point: it reproduces "
            "that fit and is not a prediction of it"
            + (f"; {fmt(tr['low'])}-{fmt(tr['high'])} tok/s over the model's uncertain inputs." if tr else ".")
        )
    if sh:
        out["range_note"] = (
            f"(Central values; over the stated input ranges the interconnect is {fmt(100 * sh['low'])}-{fmt(100 * sh['high'])}% of each token.)"
        )
    return out


def _bottleneck(head: dict, pred: dict | None) -> dict[str, Any]:
    share = head["interconnect_share"]
    rv = head.get("range_verdict")
    if rv and rv.get("statement"):
        # Model-based: only what holds at every corner of the stated input ranges (tpcomm/predict/ranges.py), then the
        # bounds that hold everywhere.
        text = rv["statement"] + (
            " " + head["bounds"]["statement"] if (head.get("bounds") or {}).get("statement") else ""
        )
        return {
            "interconnect_is_bottleneck": rv.get("interconnect_is_bottleneck"),
            "interconnect_share": share,
            "main_other": rv.get("main_other"),
            "statement": text,
            "decided": rv.get("decided"),
            "decides": rv.get("decides") or rv.get("cause_decides"),
        }
    terms = head["terms"]
    others = {k: v for k, v in terms.items() if k not in ("transfer", "wait", "collectives") and v}
    main_other = max(others, key=others.get) if others else None
    names = {
        "compute": "compute (kernels and weight streaming)",
        "weights": "weight streaming from memory",
        "overhead": "per-kernel launch and host overhead",
        "host_overhead": "host overhead (scheduling, sampling, Python)",
        "kv_cache": "KV-cache reads",
    }
    is_bn = share >= BOTTLENECK_SHARE
    if is_bn:
        text = f"The interconnect is the bottleneck: it takes {fmt(share * 100)}% of each token."
    elif share >= MAJOR_SHARE:
        text = (
            f"The interconnect is a major part ({fmt(share * 100)}%) but not the only cause; the largest other term "
            f"is {names.get(main_other, main_other)}."
        )
    else:
        text = (
            f"The interconnect is not the bottleneck ({fmt(share * 100)}% of each token); the cause is elsewhere: "
            f"{names.get(main_other, main_other)}."
        )
    wait, transfer = head.get("wait_ms"), head.get("transfer_ms")
    if wait is not None and transfer is not None and wait > transfer:
        text += (
            " Most collective time is waiting for the slowest rank, not moving bytes: a faster link alone "
            "helps little; rank skew (uneven compute or host jitter) is what to remove."
        )
    if pred and terms.get("compute"):
        floor = sum(v for k, v in pred["terms"].items() if k != "collectives" and isinstance(v, (int, float)))
        if floor and terms["compute"] / floor >= SLOW_KERNEL_RATIO:
            text += (
                f" Measured compute ({fmt(terms['compute'])} ms) is {fmt(terms['compute'] / floor)}x what the analytic model "
                f"expects for weight streaming plus per-kernel overhead on {pred.get('hardware')} ({fmt(floor)} ms): "
                "the kernels run slower than memory bandwidth allows (a slow kernel path)."
            )
    if (
        head is not None
        and terms.get("host_overhead")
        and terms["host_overhead"] / max(head["ms_per_token"], 1e-9) >= MAJOR_SHARE
    ):
        text += f" Host overhead is {fmt(100 * terms['host_overhead'] / head['ms_per_token'])}% of each token."
    return {
        "interconnect_is_bottleneck": is_bn,
        "interconnect_share": share,
        "main_other": main_other,
        "statement": text,
    }


def _levers(inp: readers.Inputs, meas: dict | None, pred: dict | None) -> list[dict[str, Any]]:
    levers: list[dict[str, Any]] = []
    if pred:
        for w in (inp.predict or {}).get("what_if") or []:
            if w.get("tok_per_s") is None:
                continue
            chg = (
                w["delta_pct"]
                if w.get("delta_pct") is not None
                else readers.pct_change(w.get("tok_per_s"), pred["tok_per_s"])
            )
            dr = w.get("delta_pct_range") or {}
            if (
                chg is None
                or chg <= 0
                or w.get("fits_memory") is False
                or w.get("aggregate")
                or (dr.get("low") is not None and dr["low"] <= 0)
            ):
                continue  # not a single-stream lever over the whole range (a risk, no fit, no gain somewhere, or a batch): what-ifs only
            rng = (
                f", {dr['low']:+.0f}% to {dr['high']:+.0f}% over the stated input ranges"
                if dr.get("low") is not None and round(dr["low"]) != round(dr["high"])
                else ""
            )
            tok, src = w.get("tok_per_s"), "model-based (tpcomm predict)" + rng
            if meas and meas.get("tok_per_s"):
                # One column, one base: the model's relative change applied to the measured rate.
                tok, src = (
                    meas["tok_per_s"] * (1 + chg / 100),
                    "model-based change (tpcomm predict) applied to the measured rate" + rng,
                )
            levers.append(
                {
                    "name": w.get("name"),
                    "description": w.get("description", ""),
                    "tok_per_s": tok,
                    "change_pct": chg,
                    "fits_memory": w.get("fits_memory"),
                    "source": src,
                }
            )
    if meas and meas["split"]:
        levers.extend(measured.levers(meas))
    what_ifs = {w.get("name"): w for w in (inp.predict or {}).get("what_if") or []}
    for f in readers.topo_summary(inp.topo).get("findings", []):
        if not f.get("lever"):
            continue
        w = what_ifs.get(f.get("what_if"))
        tok, chg = None, None
        if w and w.get("tok_per_s") and pred:
            if f["what_if"] == "p2p-disabled":
                # The prediction assumed P2P on; found off, fixing it is the way back from the P2P-off what-if.
                tok, chg = pred["tok_per_s"], readers.pct_change(pred["tok_per_s"], w["tok_per_s"])
            else:
                tok, chg = w["tok_per_s"], w.get("delta_pct")
        levers.append(
            {
                "name": str(f["lever"]),
                "description": f["text"],
                "tok_per_s": tok,
                "change_pct": chg,
                "source": "topology finding (tpcomm topo)" + (" + tpcomm predict" if tok else ""),
            }
        )
    levers.sort(key=lambda x: -(x["change_pct"] if x["change_pct"] is not None else -1e9))
    for i, lv in enumerate(levers):
        lv["rank"] = i + 1
        lv["top"] = i < TOP_LEVERS
    return levers
