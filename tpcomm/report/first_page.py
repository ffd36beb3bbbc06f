"""Page one: the headline, where each token goes, the verdict and the levers, as data the renderers lay out.

Nothing is judged here: the split and the measured verdict come from attribution/summary.json
(`tpcomm.rundir.results.Attribution`, written by attribute), the model-based verdict and the what-ifs from
predict.json, the levers from levers.json (tpcomm/analysis/levers.py, by judge/levers.py's rule), the definitions from tpcomm/judge/definitions.py.
One denominator: the headline is the engine's per-token time at the headline level and the split's terms
sum to it (the bar ends there); the client's TPOT stands beside it, never in it.

Units: *_ms milliseconds per token, tok/s per stream, *_pct percent.
"""

from __future__ import annotations

from tpcomm.analysis import levers as run_levers
from tpcomm.columns import fmt
from tpcomm.judge import bottleneck, complete, definitions
from tpcomm.judge import delivery as deliver
from tpcomm.judge import levers as L
from tpcomm.judge.speaks import level_that_speaks
from tpcomm.report import readers
from tpcomm.report.sections import PageOne, TokenSplit
from tpcomm.rundir.documents import Prediction
from tpcomm.rundir.results import Attribution, LevelSplit, Verdict
from tpcomm.terms import BY_NAME

TOP_LEVERS = 5


def page_one(inp: readers.Inputs, cmds: dict[str, str], s):
    d = PageOne()
    s.data = d
    att: Attribution | None = inp.attribution
    head = att.headline_level() if att else None
    pred = inp.predict if inp.predict and inp.predict.tok_per_s else None
    warn = []
    if stopped := readers.incomplete_stages(inp):
        warn.append(f"INCOMPLETE run: {', '.join(stopped)} (status.json); below is what was measured before that.")
    if att is not None and att.not_timed:
        warn.append(
            "Not timed by the hook (in no term; their time counts as compute): " + "; ".join(att.not_timed) + "."
        )
    if warn:
        d.warning = " ".join(warn)
    if head is not None:
        _measured(d, att, head, inp)
    elif _client_only(d, inp):
        d.sentences.append(
            f"Where each token goes: not measured ({readers.no_split_reason(inp)}). Measure it with: "
            f"{cmds['attribute_plugin']}"
        )
        s.missing("per-token split (compute / transfer / wait / host gap)", cmds["attribute_plugin"])
    elif pred:
        _model(d, pred, inp)
    elif bad := _incomplete_levels(inp):
        d.sentences.append(
            "No headline: every measured level is incomplete ("
            + "; ".join(f"C={c} repeat {r}: {why}" for (c, r), why in bad[:4])
            + f"). Measure again with: {cmds['attribute']}"
        )
        s.missing("single-stream tok/s from a complete level", cmds["attribute"])
        return s
    else:
        d.sentences.append("No measurement and no prediction in this run directory: nothing to conclude yet.")
        s.missing("single-stream tok/s and its split (measured)", cmds["attribute"])
        s.missing("single-stream tok/s (model-based)", cmds["predict"])
        return s
    s.available = True
    s.conditions = d.conditions
    d.levers, d.bounds, d.levers_note = _levers(inp, cmds)
    d.definitions = _definitions(d)
    return s


def _measured(d: PageOne, att: Attribution, lv: LevelSplit, inp: readers.Inputs) -> None:
    ms, t, how = lv.token_view()
    cond = att.conditions
    d.source, d.level, d.verdict = "measured", lv, att.verdict
    n = d.numbers
    n.update(concurrency=lv.concurrency, clock=lv.clock)
    if ms is None:  # speculative decoding without the tokens per step: the engine's step, named as such
        step, t = lv.engine_ms_per_token, lv.per_token_ms
        d.split = TokenSplit(t.as_dict(), step, "measured", lv.shares_pct, per="engine step")
        n.update(tok_per_s=None, ms_per_token=None, ms_per_engine_step=step)
        d.headline = (
            f"Single stream: tok/s not measured ({how}); the engine step {fmt(step)} ms ({lv.clock} clock, "
            f"C={lv.concurrency})"
        )
    else:
        d.split = TokenSplit(t.as_dict(), ms, "measured", lv.shares_pct)
        n.update(tok_per_s=1e3 / ms, ms_per_token=ms)
        if how:
            n.update(ms_per_engine_step=lv.engine_ms_per_token, tokens_per_step=lv.spec_decode.tokens_per_step)
        d.headline = (
            f"Single stream: {fmt(1e3 / ms)} tok/s ({fmt(ms)} ms per token, engine"
            + (f": {how}" if how else "")
            + f", {lv.clock} clock, C={lv.concurrency})"
        )
    n.update({f"{k}_ms": v for k, v in t.as_dict().items()})
    n.update({f"{k}_pct": v for k, v in (lv.shares_pct or {}).items()})
    # The client beside it: what the closure compares (per request, over the tokens it could time), never the
    # plain TPOT p50 alone, which held-back streams pull towards 0.
    cz = lv.closure
    if cz is not None and cz.client_ms:
        n["client_ms_per_token_p50"] = cz.client_ms
        d.client_ms = cz.client_ms
        d.headline += f"; the client {fmt(cz.client_ms)} ms per token (p50 of {cz.requests} requests it could time)"
    if lv.client and lv.client.tpot_ms_p50:
        n["client_tpot_ms_p50"] = lv.client.tpot_ms_p50
    src = "measured from torch-profiler traces" if att.source == "trace" else "measured (tpcomm hook)"
    d.conditions = f"{src}: " + readers.short_conditions(cond)
    d.sentences.append(att.verdict.statement)
    plat = machine(inp, lv).platform
    if capped := deliver.statement(lv.delivery_term, lv.host_load, plat):
        d.sentences.append(capped)
    d.sentences.append(_closure_sentence(lv))
    d.five = five_terms_table(lv)
    dt = lv.delivery_term
    if dt is not None and dt.measured:
        n.update(delivery_ms=dt.ms, client_ms_per_token=dt.client_ms, five_term_sum_ms=dt.sum_ms)
    if lv.host_load is not None:
        n.update(cpu_pressure_pct=lv.host_load.cpu_pressure_pct, host_loaded=lv.host_load.high)


FIVE_HEADER = ["as the client saw it (its requests' own steps)", "ms per token", "% of the client's"]


def five_terms_table(lv: LevelSplit) -> tuple | None:
    """The token as the client saw it, as a table under the bar: the four engine terms (over the same
    requests) plus delivery, their sum against the client's own figure (analysis/delivery.py), and the host's
    load when it was high. A table, so the page's prose stays short."""
    dt = lv.delivery_term
    if dt is None and lv.source == "trace":
        return None
    if dt is None or not dt.measured:
        why = "this summary predates it: tpcomm attribute --reanalyse RUN_DIR" if dt is None else dt.why_not_measured
        rows = [["delivery (the API server's part)", "not measured", why]]
    else:
        c = dt.client_ms
        # the terms over the same requests' steps (they add up to the sum below; above C=1 the bar's are the
        # whole window's)
        terms = dt.split_terms or lv.per_token_ms
        t = terms.as_dict() if terms else {}
        # A share of the client's time says nothing where one part exceeds the whole: the client's time per token
        # was shorter than the engine's (its tokens held, then sent in bursts: delivery negative by the rest).
        lumped = c > 0 and any(v > c for v in [*t.values(), dt.ms])
        share = (lambda v: f"{100 * v / c:.1f}%") if c > 0 and not lumped else (lambda v: "n/a")
        rows = [[BY_NAME[k].label, fmt(v), share(v)] for k, v in t.items()]
        held = f"; {dt.held_tokens} held token(s) in it" if dt.held_tokens else ""
        rows.append([f"delivery (API server, streaming{held})", fmt(dt.ms), share(dt.ms)])
        if lumped:
            rows.append(
                [
                    "shares of the client's time",
                    "n/a",
                    f"a part exceeds the whole: the client saw {fmt(c)} ms per token, the engine made one every "
                    f"{fmt(dt.engine_ms)} ms; its tokens were held and came in bursts (delivery negative by the "
                    "difference; its time went to the first token)",
                ]
            )
        if dt.judged:
            check = (
                f"{dt.diff_pct:+.1f}%{dt.of}: pairing of tokens to steps {'holds' if dt.ok else 'FAILS'} "
                f"(<= {dt.tolerance_pct:g}%)"
            )
            if dt.early_tokens:
                check += f"; {dt.early_tokens} tokens received before their step ended"
        else:
            check = (
                f"{dt.diff_pct:+.1f}%, not judged: {dt.why_not_judged}"
                if dt.diff_pct is not None
                else f"not judged: {dt.why_not_judged}"
            )
        rows.append(["sum of the five", fmt(dt.sum_ms), check])
        rows.append([f"client, pooled over {dt.requests} requests", fmt(c), "100%"])
        if dt.delay_ms_p50 is not None:
            rows.append(
                ["token delay, step end to receipt", f"p50 {fmt(dt.delay_ms_p50)}", f"max {fmt(dt.delay_ms_max)} ms"]
            )
    if (h := lv.host_load) is not None and h.high:
        waits = ", ".join(
            f"{who} waited {fmt(v)} ms/token"
            for who, v in (("API server", h.api_server_wait_ms_per_token), ("client", h.client_wait_ms_per_token))
            if v is not None
        )
        pres = f"CPU pressure {fmt(h.cpu_pressure_pct)}%" if h.cpu_pressure_pct is not None else "pressure n/a"
        load = f"load {fmt(h.loadavg_1m)} on {h.cpus} CPUs" if h.loadavg_1m is not None else ""
        rows.append(["LOADED HOST (the machine's)", pres, "; ".join(x for x in (load, waits) if x)])
    return (FIVE_HEADER, rows, [1.6, 0.9, 3.5])


def _closure_sentence(lv: LevelSplit) -> str:
    c = lv.closure
    if c is None:
        return (
            f"Closure: not compared (no client timings{' in traces' if lv.source == 'trace' else ''} for this level)."
        )
    if not c.judged:
        spec = (
            " (speculative decoding: a decode step makes several of a request's tokens, and the closure pairs one "
            "token with one step)"
            if lv.spec_decode is not None
            else ""
        )
        return f"Closure not judged: {c.why_not_judged}{spec}."
    both = f"engine {fmt(c.engine_ms)} vs client {fmt(c.client_ms)} ms per token, {c.diff_pct:+.1f}% ({c.statistic})"
    if c.ok:
        return f"Closure: the split accounts for what the client saw ({both}; tolerance {c.tolerance_pct:g}%)."
    if lv.delivery_term is not None and lv.delivery_term.ok:
        return (
            f"Pace closure beyond {c.tolerance_pct:g}% ({both}): the client got tokens late, then in catch-up "
            "bursts; the five terms (table) account for its time: the cause is delivery, not the split."
        )
    return (
        f"CLOSURE FAILED: {both}, beyond {c.tolerance_pct:g}%: the split explains the engine's time, not the "
        "client's; cause not determined."
    )


def _incomplete_levels(inp: readers.Inputs) -> list[tuple[tuple, str]]:
    """((concurrency, repeat), why) for each level judged incomplete (judge/complete.py): from the summary's
    judgement, else from load/levels.json alone (a run that ended before its analysis)."""
    att = inp.attribution
    judged = {(lv.concurrency, lv.repeat): lv.incomplete for lv in (att.levels if att else [])}
    out = []
    for x in inp.levels or []:
        key = (x.concurrency, x.repeat)
        why = judged[key] if key in judged else complete.level_incomplete(x, None)
        if why:
            out.append((key, why))
    return out


def _client_only(d: PageOne, inp: readers.Inputs) -> bool:
    """No split (plugin off): the headline is the client's TPOT p50 at the lowest complete concurrency level (an
    incomplete one, judge/complete.py, gives none: failed or coalesced streams once made it 80554 tok/s). False
    (and `d` untouched) where no level gives one."""
    bad = dict(_incomplete_levels(inp))
    lv = level_that_speaks(
        inp.levels or [],
        concurrency=lambda x: x.concurrency,
        figure=lambda x: x.tpot_ms_p50 or None,
        incomplete=lambda x: bad.get((x.concurrency, x.repeat)),
    )
    if lv is None:
        return False
    c, ms = lv.concurrency, lv.tpot_ms_p50
    cond = readers.short_conditions(readers.levels_conditions(inp.levels))
    d.source = "measured"
    d.headline = f"Single stream: {fmt(1e3 / ms)} tok/s (client TPOT p50 {fmt(ms)} ms, C={c}); no per-token split"
    d.numbers = {"tok_per_s": 1e3 / ms, "ms_per_token": ms, "concurrency": c, "client_tpot_ms_p50": ms}
    d.conditions = "measured (client only): " + cond  # no split: the load's own conditions
    return True


def _model(d: PageOne, pred: Prediction, inp: readers.Inputs) -> None:
    ss = pred.single_stream
    rg = pred.range or {}
    tr = (rg.get("single_stream") or {}).get("tok_per_s")
    br = dict(ss.breakdown_ms)
    total = sum(br.values())
    v = bottleneck.from_range(rg["verdict"]) if rg.get("verdict") else None
    if v is None:  # a model with every input fixed: one breakdown, one verdict
        c = bottleneck.classify(br)
        v = Verdict(
            "model-based",
            True,
            c["bottleneck"],
            c["share"],
            c["share"],
            c["main_other"],
            None,
            f"The interconnect is {'' if c['bottleneck'] else 'not '}the bottleneck in the model: "
            f"{bottleneck.pct(c['share'])}% of each token.",
        )
    d.source, d.verdict, d.split = "model-based", v, TokenSplit(br, total, "model-based")
    fitted = next(
        (b.get("fitted_to_tok_per_s") for b in pred.batches if b.get("batch") == 1 and b.get("fitted_to_tok_per_s")),
        None,
    )
    rng = f", {fmt(tr['low'])}-{fmt(tr['high'])} over the model's stated input ranges" if tr else ""
    d.headline = f"Single stream (MODEL-BASED, not measured): {fmt(ss.tok_per_s)} tok/s central{rng} ({fmt(ss.ms_per_token or 1e3 / ss.tok_per_s)} ms per token)"
    if fitted:
        d.headline += f"; extra terms fitted to the measured {fmt(fitted)} tok/s: this reproduces that fit, it does not predict it"
    d.numbers.update(
        tok_per_s=ss.tok_per_s,
        ms_per_token=ss.ms_per_token,
        **({"tok_per_s_low": tr["low"], "tok_per_s_high": tr["high"]} if tr else {}),
    )
    d.conditions = "model-based: " + readers.short_predict_conditions(pred)
    d.sentences.append(v.statement)
    if (rg.get("bounds") or {}).get("statement"):
        d.sentences.append(rg["bounds"]["statement"])


def machine(inp: readers.Inputs, head: LevelSplit | None) -> L.Machine:
    """The machine the levers were judged for (tpcomm/analysis/levers.py), from the report's inputs."""
    return run_levers.machine(_run_inputs(inp), head)


def _run_inputs(inp: readers.Inputs) -> run_levers.RunInputs:
    return run_levers.RunInputs(inp.attribution, inp.predict, inp.topo, inp.meta, inp.plan)


def _levers(inp: readers.Inputs, cmds: dict[str, str]):
    """The levers as the analysis stored them (levers.json); computed now by the same function only where the
    file is absent or older than its inputs, and then said so."""
    got, why = run_levers.current(inp.rd)
    notes = []
    if got.more_with_predict:
        notes.append(f"More levers, sized on this run's split: {cmds['predict_attribution']}")
    if why:
        notes.append(f"Levers computed by the report: {why}.")
    # what is not offered (and why) stays in the what-if section
    return got.levers[:TOP_LEVERS], got.bounds, " ".join(notes) or None


def _definitions(d: PageOne) -> list[str]:
    t = definitions.TERM
    if d.source == "measured" and d.split:
        return [t["transfer"], t["wait"], t["host_gap"], t["delivery_term"], t["closure"]]
    return []
