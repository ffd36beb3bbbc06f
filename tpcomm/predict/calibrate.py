"""`tpcomm predict --attribution RUN_DIR`: the model anchored on a measured run.

The measured per-token terms of a `tpcomm attribute` run (lowest concurrency
level of attribution/summary.json; any backend) are kept as measured; a
what-if replaces only the part it changes, and says how:
- collectives free: compute + host (the measured terms, exactly);
- no rank skew: the wait term removed;
- another link / a one-shot all-reduce (GPU links): transfer = the plan's
  collectives x the modelled latency (low / central / high), wait kept;
- another TP size: compute scaled by the analytic model's ratio of
  non-collective time, transfer modelled at the new world size, wait scaled
  by the collective count, host kept;
- batch B: compute and transfer scaled by the model's ratios at B vs 1.
The terms are read from the typed summary (tpcomm.rundir.results.Attribution) at its
headline level: compute, transfer, wait, host_gap, and the run's own per-token
time engine_ms_per_token. The two what-ifs the measured split alone sizes
(collectives free, no rank skew) come from tpcomm/judge/levers.py, the same
entries the report shows without predict.

Units: *_ms milliseconds per token (one stream), tok/s.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tpcomm.errors import InputError
from tpcomm.judge.levers import measured_whatifs
from tpcomm.plan.collectives import VLLM_VERSION_FOLLOWED
from tpcomm.plan.layout import Layout
from tpcomm.predict import described, plan_for, tables
from tpcomm.predict.hardware import load_profile, with_interconnect
from tpcomm.predict.latency import LatencySource
from tpcomm.predict.latency_range import LEVELS, LatencyRange, custom_ar_eligible, make_range
from tpcomm.predict.model import Knobs, step_time
from tpcomm.predict.ranges import central_knobs, range_inputs
from tpcomm.rundir import contract as C
from tpcomm.terms import ENGINE_TERMS

ZERO = LatencySource("zero", "free", lambda op, b, n: 0.0)


def read_attribution(run_dir: str | Path) -> dict:
    from tpcomm.rundir.layout import RunDir

    att = RunDir(run_dir, create=False).read(C.ATTR_SUMMARY)
    if att is None or not att.levels:
        raise InputError(
            f"--attribution {run_dir}",
            "has no attribution/summary.json with levels",
            "a run directory written by `tpcomm attribute --out`",
        )
    lv = att.headline_level()
    if lv is None:
        raise InputError(
            f"--attribution {run_dir}",
            "has no per-token split (the server ran without the tpcomm plugin, or no level was attributed)",
            "a tpcomm attribute run against a server started with VLLM_PLUGINS=tpcomm",
        )
    where = f"levels[concurrency={lv.concurrency}, repeat={lv.repeat}]"
    if lv.spec_decode is not None:
        # The model's decode step carries one token per sequence: its modelled transfer, collectives per token
        # and TP what-ifs would be per engine step beside terms per token emitted (LevelSplit.token_view).
        raise InputError(
            f"--attribution {run_dir}",
            f"ran speculative decoding at {where} ({lv.spec_decode.drafts_per_seq:.2f} drafts per sequence per "
            "step): predict's what-ifs model a step of one token per sequence and are not anchored on it",
            "a run without speculative decoding; the report sizes the measured split's own levers per token emitted",
        )
    t = lv.per_token_ms
    return {
        "run_dir": str(run_dir),
        "concurrency": lv.concurrency,
        "terms_ms": t.as_dict(),  # the measured terms under their own names (tpcomm/terms.py)
        "measured_ms_per_token": lv.engine_ms_per_token,
        "measured_from": f"engine_ms_per_token of {where}",
        "keys_read": [f"{where}.per_token_ms.{k}" for k in ENGINE_TERMS] + [f"{where}.engine_ms_per_token"],
        "seqs_per_step": lv.seqs_per_step or 1.0,
        "conditions": att.conditions,
    }


def predict_calibrated(
    model,
    run_dir,
    layout: Layout | None = None,
    gpu: str = "rtx-pro-6000",
    batches=(1,),
    knobs: Knobs | None = None,
    engine: str | None = None,
) -> dict:
    """The measured host gap replaces the engine's host term (engine.py): it is kept as measured in every
    what-if; the engine named (or the default) only describes the run."""
    from tpcomm.predict.engine import resolve_engine

    layout = layout or Layout()
    tp = layout.tp
    att = read_attribution(run_dir)
    run_tp = att["conditions"].get("tp")
    if run_tp and int(run_tp) != tp:
        raise InputError(
            f"--tp {tp}",
            f"differs from the measured run's TP {run_tp}",
            f"--tp {run_tp} (the what-ifs vary TP from there)",
        )
    hw = load_profile(gpu)
    k = knobs or Knobs()
    plan = plan_for(model, layout, sorted({1, *batches}))
    probe = Path(run_dir) / "probe" / "fit.json"
    try:  # latency for the modelled parts: the run's own probe if it has one, else the profile's range
        lat, lat_err = make_range(hw, probe_dir=run_dir if probe.is_file() else None, n=tp), None
    except InputError as e:  # CPU without a probe: no latency model, so what-ifs that need one say so
        lat, lat_err = None, str(e)
    eng = resolve_engine(engine)
    if eng.family != "vllm":  # the run is vLLM's (the plugin and the profiler traces are vLLM's): its plan is vLLM's
        raise InputError(
            f"--engine {engine}",
            f"is {eng.family}, but --attribution {run_dir} is a run tpcomm measured inside vLLM",
            "a vllm[-VERSION] engine, or no --engine",
        )
    # No engine here: the host term is the run's measured host gap, so the model's ratios exclude it.
    kc = central_knobs(range_inputs(hw, k, lat), k)
    m = att["terms_ms"]  # the model's "host" term is the measured host gap below
    base_ms = sum(m.values())

    def noncoll(p, b):
        return step_time(p, b, hw, ZERO, kc)["step_ms"]

    def coll_ms(p, b, src):
        return step_time(p, b, hw, src, kc)["breakdown_ms"]["collectives"]

    out: list[dict] = []

    def entry(name, desc, by_level: dict, batch=1, **extra):
        c = by_level["central"]
        toks = {lv: batch * 1e3 / sum(t.values()) for lv, t in by_level.items()}
        out.append(
            {
                "name": name,
                "description": desc,
                "tok_per_s": toks["central"],
                "ms_per_token": sum(c.values()) / batch,
                "delta_pct": 100 * (toks["central"] * base_ms / 1e3 - 1),
                "breakdown_ms": c,
                "tok_per_s_range": {"low": min(toks.values()), "central": toks["central"], "high": max(toks.values())},
                "delta_pct_range": {
                    "low": 100 * (min(toks.values()) * base_ms / 1e3 - 1),
                    "high": 100 * (max(toks.values()) * base_ms / 1e3 - 1),
                },
                **extra,
            }
        )

    out.extend(measured_whatifs(m))  # collectives free, no rank skew: the measured terms alone size them
    link = hw["link"]

    def relinked(name, desc, rng: LatencyRange):
        entry(name, desc, {lv: {**m, "transfer": coll_ms(plan, 1, rng.level(lv))} for lv in LEVELS})

    if link["type"] == "pcie":
        nv = {**with_interconnect(hw, "nvlink4"), "collective_tables": "h100_sxm"}
        nv.pop("interconnect_override", None)
        relinked(
            "nvlink",
            "NVLink4 instead of the measured link: transfer modelled (8x H100 SXM tables where they apply), wait kept",
            make_range(nv, n=tp),
        )
    if link["type"] == "pcie" and link.get("p2p", True) and not custom_ar_eligible(link, tp, eng) and lat is not None:

        def one(i):
            return LatencySource(
                "oneshot",
                "one-shot",
                lambda op, b, n: (
                    tables.oneshot_4rank_us(b, n)[i] if op == "all_reduce" and n > 1 else lat.central(op, b, n)
                ),
            )

        relinked(
            "one-shot-allreduce",
            "a one-shot P2P all-reduce (FlashInfer PCIe IPC or a custom kernel): transfer from the measured 4-rank "
            "one-shot figures (REFERENCE s5, s7), wait kept",
            LatencyRange(one(0), one(1), one(2), "oneshot", {}),
        )
    n_coll = sum(c.count for c in plan.for_batch(1))
    for t in (1, 2, 4, 8):
        if t == tp:
            continue
        try:
            p2 = plan_for(model, replace(layout, tp=t, dcp=layout.dcp if t % layout.dcp == 0 else 1), [1])
        except InputError:
            continue
        n2 = sum(c.count for c in p2.for_batch(1))
        try:
            if not p2.for_batch(1):
                levels = dict.fromkeys(LEVELS, 0.0)  # no collectives at this layout: no latency needed
            elif lat is None:
                raise InputError("collective latency", lat_err)
            else:
                rng = lat if link["type"] == "shm" or lat.fixed else make_range(hw, n=t)
                levels = {lv: coll_ms(p2, 1, rng.level(lv)) for lv in LEVELS}
        except InputError as e:
            out.append(
                {
                    "name": f"tp{t}",
                    "description": f"TP {t}: no collective latency for it ({e})",
                    "tok_per_s": None,
                    "ms_per_token": None,
                    "delta_pct": None,
                }
            )
            continue
        scale = noncoll(p2, 1) / noncoll(plan, 1)
        entry(
            f"tp{t}",
            f"TP {t}: compute x {scale:.2f} (the model's ratio), transfer modelled, wait x {n2}/{n_coll} collectives, host kept",
            {
                lv: {
                    "compute": m["compute"] * scale,
                    "transfer": levels[lv],
                    "wait": m["wait"] * n2 / n_coll if n_coll else 0.0,
                    "host": m["host_gap"],
                }
                for lv in LEVELS
            },
        )
    for b in sorted(set(batches) - {1}):
        if lat is None:
            out.append(
                {
                    "name": f"batch{b}",
                    "description": f"batch {b}: no collective latency to scale ({lat_err})",
                    "tok_per_s": None,
                    "ms_per_token": None,
                    "delta_pct": None,
                    "aggregate": True,
                }
            )
            continue
        cs, c1 = noncoll(plan, b) / noncoll(plan, 1), {lv: coll_ms(plan, 1, lat.level(lv)) for lv in LEVELS}
        by = {
            lv: {
                "compute": m["compute"] * cs,
                "transfer": m["transfer"] * (coll_ms(plan, b, lat.level(lv)) / c1[lv] if c1[lv] else 1.0),
                "wait": m["wait"],
                "host": m["host_gap"],
            }
            for lv in LEVELS
        }
        entry(
            f"batch{b}",
            f"batch {b}: compute x {cs:.2f} and transfer scaled by the model's ratios at batch {b} vs 1 (tok/s = all streams)",
            by,
            batch=b,
            aggregate=True,
        )
    doc = {
        **described(plan, hw),
        "engine": {
            **eng.as_dict(),
            "host_ms": {"low": m["host_gap"], "central": m["host_gap"], "high": m["host_gap"]},
            "host_source": f"measured host gap of {run_dir} (replaces the engine's host term {eng.host_ms[0]:g}-"
            f"{eng.host_ms[2]:g} ms)",
        },
        "collective_latency_source": f"measured in {run_dir} (attribute); what-ifs: {lat.central.description if lat else lat_err}",
        "collective_latency_kind": "attribution",
        "single_stream": {
            "ms_per_token": base_ms,
            "tok_per_s": 1e3 / base_ms,
            "breakdown_ms": dict(m),
            "bound": "measured",
            "collectives_per_token": n_coll,
            "value": "measured terms",
        },
        "ceilings": {
            "compute_only_tok_per_s": 1e3 / (m["compute"] + m["host_gap"]),
            "comm_only_tok_per_s": 1e3 / m["transfer"] if m["transfer"] > 0 else None,
            "interconnect_share_of_token": (m["transfer"] + m["wait"]) / base_ms,
        },
        "calibration": {
            **{k2: att[k2] for k2 in ("run_dir", "concurrency", "keys_read", "measured_ms_per_token", "measured_from")},
            "terms_ms": m,
            "reproduces_pct": 100 * (base_ms / att["measured_ms_per_token"] - 1),
            "conditions": _cond(att["conditions"]),
        },
        "conditions": {
            "phase": "decode",
            "context_tokens": kc.context,
            "model": "measured terms + analytic what-ifs",
            "vllm_version_followed": VLLM_VERSION_FOLLOWED,
        },
        "assumptions": [
            f"measured per-token terms from {run_dir} at concurrency {att['concurrency']} (kept as measured)",
            (
                f"collective latency for modelled parts: {lat.central.description} (range low: {lat.descriptions['low']}; "
                f"high: {lat.descriptions['high']})"
                if lat
                else f"collective latency for modelled parts: none ({lat_err})"
            ),
            f"compute ratios from the analytic model at memory efficiency {kc.memory_efficiency:g}, per-kernel overhead "
            f"{kc.kernel_overhead_us:g} us (central values; ratios only)",
            "rank skew (wait) per collective unchanged by a what-if; host term per step unchanged",
            f"host term = the measured host gap {m['host_gap']:.3f} ms per token (replaces the engine's host term of "
            f"{eng.name}: {eng.host_ms[0]:g}-{eng.host_ms[2]:g} ms, {eng.host_source})",
        ],
        "what_if": out,
    }
    return doc


def _cond(c: dict) -> str:
    bits = [f"{k} {c[k]}" for k in ("model", "tp", "api", "input_len", "output_len") if c.get(k) is not None]
    if c.get("backends"):
        bits.append("backends " + ", ".join(map(str, c["backends"])))
    return ", ".join(bits) or "conditions not recorded"
