"""Tolerant readers of the run directory for the report.

Each helper takes what another command wrote (the files and their schemas are
named once, in tpcomm/rundir/contract.py; RunDir checks them on read) and returns plain
Python data, or None when the file is absent. A file that breaks the contract
is kept out with its one-line error in `Inputs.errors`.

Units: bytes, *_us microseconds, *_ms milliseconds, *_GBps 1e9 bytes/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tpcomm.rundir import contract as C
from tpcomm.rundir.contract import SchemaError
from tpcomm.rundir.documents import Layout, LoadLevel, Meta, Plan, Prediction, ProbeFit, Status, Timeline, Topo
from tpcomm.rundir.layout import RunDir
from tpcomm.rundir.results import Attribution


@dataclass
class Inputs:
    """The run directory's documents as their dataclasses (tpcomm/rundir/documents.py); None: absent or refused."""

    rd: RunDir
    meta: Meta | None = None
    status: Status | None = None
    topo: Topo | None = None
    plan: Plan | None = None
    predict: Prediction | None = None
    probe: Any = None  # DataFrame from probe/results.parquet (or the JSON twin)
    probe_fit: ProbeFit | None = None
    timeline: Timeline | None = None  # attribution/timeline.json: `attribute` aligned the records, the report draws
    replay: dict | None = None  # probe/replay.json (no dataclass yet: report/replay.py reads it)
    trace_compare: dict | None = None  # trace/compare.json: the hook and the traces on one window
    levels: list[LoadLevel] | None = None  # load/levels.json
    attribution: Attribution | None = None  # attribution/summary.json
    attribution_steps: Any = None
    files_present: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # file -> one-line contract error


# What the report reads (tpcomm/rundir/contract.py names every file of a run directory and its schema).
READ = {
    "meta": C.META,
    "status": C.STATUS,
    "topo": C.TOPO,
    "plan": C.PLAN,
    "predict": C.PREDICT,
    "probe": C.PROBE_RESULTS,
    "probe_fit": C.PROBE_FIT,
    "levels": C.LOAD_LEVELS,
    "attribution": C.ATTR_SUMMARY,
    "attribution_steps": C.ATTR_STEPS,
    "timeline": C.ATTR_TIMELINE,
    "replay": C.REPLAY,
    "trace_compare": C.TRACE_COMPARE,
}
FILES = [s.path for s in C.ALL.values() if s.format != "aux"]


def load_inputs(rd: RunDir) -> Inputs:
    """Every input the report uses. A file that breaks the contract is left out (None) and its one-line
    error kept in `inp.errors`, so the report renders every other section and marks the affected ones."""
    inp = Inputs(rd=rd)
    for attr, spec in READ.items():
        try:
            setattr(inp, attr, rd.read_table(spec) if spec.format == "table" else rd.read(spec))
        except SchemaError as e:
            inp.errors[spec.path] = str(e)
    if inp.probe is None and rd.exists(C.PROBE_RESULTS_JSON) and C.PROBE_RESULTS.path not in inp.errors:
        import pandas as pd

        try:
            doc = rd.read_json(C.PROBE_RESULTS_JSON)
            rows = doc.get("results", doc.get("rows")) if isinstance(doc, dict) else doc
            inp.probe = pd.DataFrame(rows) if rows else None
            lacking = [c.name for c in C.PROBE_RESULTS.columns if inp.probe is not None and c.name not in inp.probe]
            if lacking:
                inp.probe = None
                raise SchemaError(C.PROBE_RESULTS_JSON, "lacks a result field", lacking[0])
        except SchemaError as e:
            inp.errors[C.PROBE_RESULTS_JSON.path] = str(e)
    if inp.status:
        _require_stage_files(inp)
    inp.files_present = [f for f in FILES if rd.exists(f)]
    return inp


# A stage that status.json marks complete wrote these; one missing is an error, not "not measured".
STAGE_FILES = {"attribute": (C.LOAD_REQUESTS, C.LOAD_LEVELS, C.ATTR_SUMMARY), "probe": (C.PROBE_RESULTS,)}


def _require_stage_files(inp: Inputs) -> None:
    for stage, specs in STAGE_FILES.items():
        if inp.status.state(stage) != "complete":
            continue
        for spec in specs:
            try:
                inp.rd.require(spec)
            except SchemaError as e:
                inp.errors.setdefault(spec.path, str(e) + f" (status.json marks {stage} complete)")


def incomplete_stages(inp: Inputs) -> list[str]:
    """'attribute (server stopped answering)' for every stage status.json marks incomplete or failed."""
    out = []
    for stage, st in (inp.status.stages if inp.status else {}).items():
        if stage == "demo":
            continue
        if st.state in ("incomplete", "failed"):
            out.append(f"{stage} ({st.reason or st.state})")
        elif st.rerun is not None:
            # a re-run over a finished stage (rundir.mark): still writing, or it died half-way
            from tpcomm.rundir.lock import holder

            since = st.rerun.utc or "?"
            out.append(
                f"{stage} (a re-run started {since} is still writing this directory)"
                if holder(inp.rd.path)
                else f"{stage} (a re-run started {since} stopped before it ended: files may mix it with the "
                f"earlier {st.state} run)"
            )
    return out


def no_split_reason(inp: Inputs) -> str:
    """Why there is no measured per-token split, from what the run directory says (never a guess)."""
    att = inp.attribution
    if att is not None and not att.plugin:
        return "the server ran without the tpcomm plugin (no hook records)"
    notes = sorted({lv.note for lv in (att.levels if att else []) if lv.note})
    why = "; ".join(notes) if notes else "no level with a split"
    if stopped := incomplete_stages(inp):
        why = f"the run is incomplete: {', '.join(stopped)}; {why}"
    return why


def plan_config_text(att: Attribution | None) -> str | None:
    """Which model config the cross-check planned from, as attribution/summary.json records it."""
    pc = att.plan_config if att else None
    if not isinstance(pc, dict):
        return None
    if pc.get("source") is None:  # no config: the cross-check was not made, the text says why
        return f"not made ({pc['text']})" if pc.get("text") else None
    return pc.get("text")  # as attribute wrote it (crosscheck.plan_config)


def commands_for(inp: Inputs) -> dict[str, str]:
    """The command that fills each missing piece, with this run's model and layout filled in."""
    out = str(inp.rd.path)
    doc = inp.plan or inp.predict
    # A model read from a folder is named by its path; a preset by its name.
    src = str(doc.model.source or "") if doc else ""
    model = src if src.startswith("/") or src.endswith(".json") else ((doc.model.name if doc else None) or "MODEL")
    tp = (doc.layout.tp if doc else None) or "N"
    cpu = inp.meta is not None and inp.meta.vllm_build == "cpu"
    hw = (inp.predict.hardware.profile if inp.predict else None) or ("cpu" if cpu else "GPU")
    return {
        "plan": f"tpcomm plan --model {model} --tp {tp} --out {out}",
        "topo": f"tpcomm topo --out {out}",
        "probe": f"tpcomm probe --gpus {tp} --model {model} --out {out}",
        "attribute": f"tpcomm attribute --server-url URL --out {out}",
        "attribute_plugin": f"VLLM_PLUGINS=tpcomm vllm serve ... (tpcomm installed in vLLM's environment), then tpcomm attribute --server-url URL --out {out}",
        "predict": f"tpcomm predict --model {model} --tp {tp} --gpu {hw} --probe {out} --out {out}",
        "predict_attribution": f"tpcomm predict --model {model} --tp {tp} --gpu {hw} --attribution {out} --out {out}",
    }


# ---- plan ----------------------------------------------------------------
def total_count(cps: dict, key: str) -> float | None:
    """collectives_per_step[key] as one number: `{key}_total`, or the sum over a list of {count}, or the value."""
    if cps.get(f"{key}_total") is not None:
        return cps[f"{key}_total"]
    v = cps.get(key)
    if isinstance(v, list):
        return sum(x.get("count") or 0 for x in v if isinstance(x, dict))
    return v


def plan_per_step(plan: Plan | None, batch: int = 1) -> dict[str, Any]:
    """Collectives per decode step at `batch`: count and bytes per op (per rank)."""
    if not plan:
        return {}
    per_op: dict[str, dict[str, float]] = {}
    for c in plan.collectives:
        if c.batch != batch:
            continue
        d = per_op.setdefault(c.op, {"count": 0, "bytes": 0})
        d["count"] += c.count
        d["bytes"] += c.count * c.bytes
    return {
        "per_op": per_op,
        "count": sum(d["count"] for d in per_op.values()),
        "bytes": sum(d["bytes"] for d in per_op.values()),
        "batch": batch,
    }


def layout_text(layout: Layout) -> str:
    parts = [f"TP {layout.tp}"]
    parts += [f"{k.upper()} {getattr(layout, k)}" for k in ("dp", "pp", "dcp") if getattr(layout, k) > 1]
    if layout.ep:
        parts.append(f"EP {layout.ep_size}")
    return ", ".join(parts)


def plan_weights(plan: Plan, batch: int = 1) -> dict[str, Any]:
    """Weight bytes each GPU reads per decode step at `batch`: total and per component."""
    w = plan.weights or {}
    w = (
        w.get(str(batch))
        or w.get(batch)
        or (next(iter(w.values())) if w and all(isinstance(v, dict) for v in w.values()) else w)
    )
    if not isinstance(w, dict):
        return {}
    return {
        "total_bytes": w.get("bytes_per_gpu_per_step"),
        "batch": batch,
        "components": [c for c in w.get("components") or [] if isinstance(c, dict)],
    }


def plan_sizes(plan: Plan | None) -> list[dict[str, Any]]:
    """Distinct (op, bytes) message sizes of the plan, to mark on the probe figure."""
    if not plan:
        return []
    seen: dict[tuple, dict] = {}
    for c in plan.collectives:
        key = (c.op, c.bytes)
        if key[1] and key not in seen:
            seen[key] = {"op": c.op, "bytes": c.bytes, "batch": c.batch, "site": c.site}
    return sorted(seen.values(), key=lambda d: d["bytes"])


# ---- probe ---------------------------------------------------------------
def probe_table(df) -> dict[str, Any] | None:
    """probe/results.parquet (columns as tpcomm/rundir/contract.py names them; RunDir checked them) as curves and rows."""
    if df is None or len(df) == 0:
        return None
    c_bytes, c_time, c_bus, c_alg, c_p99, c_wrong = "bytes", "p50_us", "busbw_GBps", "algbw_GBps", "p99_us", "wrong"
    keys = [k for k in ("backend", "op", "mode", "timing", "world_size", "dtype") if k in df.columns]
    curves = []
    for gkey, g in df.groupby(keys, dropna=False, sort=True) if keys else [((), df)]:
        gkey = gkey if isinstance(gkey, tuple) else (gkey,)
        g = g.sort_values(c_bytes)
        pts = [(int(r[c_bytes]), float(r[c_time]), _f(r[c_bus])) for _, r in g.iterrows()]
        curves.append({**{k: (None if _isnan(v) else v) for k, v in zip(keys, gkey)}, "points": pts})
    rows = []
    for _, r in df.sort_values(keys + [c_bytes] if keys else [c_bytes]).iterrows():
        rows.append(
            {
                **{k: r[k] for k in keys},
                "bytes": int(r[c_bytes]),
                "time_us_p50": float(r[c_time]),
                "time_us_p99": _f(r[c_p99]),
                "algbw_GBps": _f(r[c_alg]),
                "busbw_GBps": _f(r[c_bus]),
                "wrong": None if _isnan(r[c_wrong]) else int(r[c_wrong]),
            }
        )
    cond = []
    for k in ("world_size", "backend", "mode", "timing", "dtype", "device", "hardware", "vllm", "torch"):
        if k in df.columns:
            vals = sorted({str(v) for v in df[k].dropna().unique()})
            if vals:
                cond.append(f"{k} {'/'.join(vals)}")
    return {"curves": curves, "rows": rows, "conditions": "; ".join(cond) or "see probe/results.parquet"}


def fit_rows(fit: ProbeFit | None) -> list[dict[str, Any]]:
    """probe/fit.json as rows: one per (backend, op, mode, timing, size segment) with alpha_us, beta_GBps."""
    if not fit:
        return []
    rows: list[dict[str, Any]] = []
    for m in fit.models:
        for seg in m.segments or [{}]:
            rows.append(
                {
                    "backend": m.backend,
                    "op": m.op,
                    "mode": m.mode,
                    "timing": m.timing,
                    "bytes": f"{seg.get('min_bytes', 0)}-{seg.get('max_bytes') or 'max'}",
                    "alpha_us": seg.get("alpha_us"),
                    "beta_GBps": seg.get("beta_GBps"),
                    "points": seg.get("points"),
                    "max_rel_err": seg.get("max_rel_err"),
                }
            )
    return rows


def fit_formula(fit: ProbeFit | None) -> str | None:
    return fit.formula if fit else None


# ---- load / attribution --------------------------------------------------
def levels_conditions(levels: list[LoadLevel] | None) -> dict | None:
    """The load's conditions (every level of a run carries the same)."""
    return next((lv.conditions for lv in levels or [] if lv.conditions), None)


COND_KEYS = (
    "model",
    "tp",
    "api",
    "input_len",
    "output_len",
    "requests_per_round",
    "plugin",
    "ranks",
    "backends",
    "timing",
    "hardware",
    "world_size",
)


def conditions_text(cond: dict | None) -> str:
    """The conditions that shape a number, in a fixed order; URLs, fingerprints and duplicates left out."""
    if not cond:
        return "conditions not recorded"
    parts = [f"{k} {_plain(cond[k])}" for k in COND_KEYS if cond.get(k) is not None]
    v = cond.get("server_versions") or cond.get("versions") or {}
    if isinstance(v, dict):
        vs = [f"{k} {v[k]}" for k in ("vllm", "torch", "nccl", "cuda", "tpcomm") if v.get(k)]
        if vs:
            parts.append("server " + ", ".join(vs))
    return "; ".join(parts)


SHORT_KEYS = ("model", "tp", "backends", "timing", "output_len")


def short_conditions(cond: dict | None) -> str:
    """Page one's one line of conditions (the full list is under the breakdown section)."""
    if not cond:
        return "conditions not recorded"
    names = {"tp": "TP", "backends": "backend", "output_len": "output tokens/request"}
    parts = [f"{names.get(k, k)} {_plain(cond[k])}" for k in SHORT_KEYS if cond.get(k) is not None]
    v = cond.get("server_versions") or cond.get("versions") or {}
    if isinstance(v, dict) and v.get("vllm"):
        parts.insert(0, f"vLLM {v['vllm']}" + (f", torch {v['torch']}" if v.get("torch") else ""))
    return "; ".join(parts)


def short_predict_conditions(pred: Prediction) -> str:
    hw, model = pred.hardware, pred.model
    bits = [
        model.name + (f" ({model.quantization.split(',')[0]})" if model.quantization else ""),
        layout_text(pred.layout),
        (hw.name or hw.profile or "?") + (f", link {link_text(hw.link)}" if hw.link else ""),
    ]
    return "; ".join(bits) + "; every input and its source in the what-if section"


def _plain(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "/".join(str(x) for x in v)
    return str(v)


def serving_config(inp: Inputs) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for cond in (levels_conditions(inp.levels), inp.attribution.conditions if inp.attribution else None):
        for k, v in (cond or {}).items():
            if not isinstance(v, dict) and k not in {r[0] for r in rows}:
                rows.append((k, _plain(v)))
    return rows


def served_model_name(inp: Inputs) -> str | None:
    for cond in (levels_conditions(inp.levels), inp.attribution.conditions if inp.attribution else None):
        if cond and cond.get("model"):
            return str(cond["model"])
    return None


# ---- predict -------------------------------------------------------------
def link_text(link: Any) -> str:
    if not isinstance(link, dict):
        return str(link or "?")
    bits = [str(link.get("type", "?")) + (f" gen{link['generation']}" if link.get("generation") else "")]
    if "p2p" in link:
        bits.append("P2P on" if link["p2p"] else "P2P OFF")
    bw = link.get("nvlink_GBps") or link.get("p2p_GBps")
    if bw:
        bits.append(f"{bw:g} GB/s")
    return ", ".join(bits)


def predict_conditions(pred: Prediction) -> str:
    hw, model = pred.hardware, pred.model
    cal = pred.calibration or {}
    what = (
        f"measured terms of {cal.get('run_dir')} at concurrency {cal.get('concurrency')}, what-ifs model-based"
        if cal
        else "model-based (not measured)"
    )
    bits = [
        f"{what}: {model.name}" + (f" ({model.quantization})" if model.quantization else ""),
        layout_text(pred.layout),
        f"hardware {hw.name or hw.profile or '?'}",
    ]
    if hw.memory_bandwidth_GBps:
        bits.append(f"{hw.memory_bandwidth_GBps:g} GB/s memory")
    if hw.link:
        bits.append(f"link {link_text(hw.link)}")
    bits.append(f"collective latency: {pred.collective_latency_source or '?'}")
    inp = (pred.range or {}).get("inputs") or {}
    if inp:  # the uncertain inputs the model's ranges span (central values above)
        ko, me, cl = (
            inp.get("kernel_overhead_us") or {},
            inp.get("memory_efficiency") or {},
            inp.get("collective_latency") or {},
        )
        lat = (
            "collective latency fixed (measured or given: no range)"
            if cl.get("low") == cl.get("high") == pred.collective_latency_source or "no range" in str(cl.get("low", ""))
            else f"collective latency low = {cl.get('low', '?')}, high = {cl.get('high', '?')}"
        )
        bits.append(
            f"ranges over per-kernel overhead {ko.get('low', '?'):g}-{ko.get('high', '?'):g} us, memory efficiency "
            f"{me.get('low', '?'):g}-{me.get('high', '?'):g}, {lat}"
        )
    if pred.fitted:
        bits.append("; ".join(f.text for f in pred.fitted))
    return "; ".join(b for b in bits if b)


def pct_change(new: float | None, base: float | None) -> float | None:
    if new is None or not base:
        return None
    return 100.0 * (new - base) / base


def _isnan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v) or v is None


def _f(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


from tpcomm.report.topology import topo_summary  # noqa: E402, F401  (re-exported for analysis.py)
