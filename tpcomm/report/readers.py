"""Tolerant readers of the run directory for the report.

Each helper takes what another command wrote (see tpcomm/rundir.py and the
schemas in each writer's docstring) and returns plain Python data, or None
when the file is absent. Column names are looked up from a few spellings so
that a report can still be rebuilt from an older run directory.

Units: bytes, *_us microseconds, *_ms milliseconds, *_GBps 1e9 bytes/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tpcomm.rundir import RunDir


@dataclass
class Inputs:
    rd: RunDir
    meta: dict | None = None
    status: dict | None = None
    topo: dict | None = None
    plan: dict | None = None
    predict: dict | None = None
    probe: Any = None            # DataFrame from probe/results.parquet (or the JSON twin)
    probe_fit: dict | None = None
    hook_collectives: Any = None
    hook_steps: Any = None
    levels: Any = None           # load/levels.json as written
    attribution: dict | None = None
    attribution_steps: Any = None
    files_present: list[str] = field(default_factory=list)


FILES = ["meta.json", "status.json", "topo.json", "plan.json", "predict.json", "probe/results.parquet",
         "probe/results.json", "probe/fit.json", "hook/collectives.parquet", "hook/steps.parquet",
         "load/requests.parquet", "load/tokens.parquet", "load/levels.json", "attribution/steps.parquet",
         "attribution/summary.json"]


def load_inputs(rd: RunDir) -> Inputs:
    inp = Inputs(rd=rd)
    inp.meta = rd.read_json("meta.json")
    inp.status = rd.read_json("status.json")
    inp.topo = rd.read_json("topo.json")
    inp.plan = rd.read_json("plan.json")
    inp.predict = rd.read_json("predict.json")
    inp.probe = rd.read_table("probe/results.parquet")
    if inp.probe is None and rd.exists("probe/results.json"):
        import pandas as pd

        doc = rd.read_json("probe/results.json")
        rows = doc.get("results", doc.get("rows")) if isinstance(doc, dict) else doc
        inp.probe = pd.DataFrame(rows) if rows else None
    inp.probe_fit = rd.read_json("probe/fit.json")
    inp.hook_collectives = rd.read_table("hook/collectives.parquet")
    inp.hook_steps = rd.read_table("hook/steps.parquet")
    inp.levels = rd.read_json("load/levels.json")
    inp.attribution = rd.read_json("attribution/summary.json")
    inp.attribution_steps = rd.read_table("attribution/steps.parquet")
    inp.files_present = [f for f in FILES if rd.exists(f)]
    return inp


def commands_for(inp: Inputs) -> dict[str, str]:
    """The command that fills each missing piece, with this run's model and layout filled in."""
    out = str(inp.rd.path)
    m = (inp.plan or inp.predict or {}).get("model") or {}
    # A model read from a folder is named by its path; a preset by its name.
    src = str(m.get("source") or "")
    model = src if src.startswith("/") or src.endswith(".json") else (m.get("name") or "MODEL")
    tp = ((inp.plan or inp.predict or {}).get("layout") or {}).get("tp") or "N"
    cpu = ((inp.meta or {}).get("versions") or {}).get("vllm_build") == "cpu"
    hw = ((inp.predict or {}).get("hardware") or {}).get("profile") or ("cpu" if cpu else "GPU")
    return {
        "plan": f"tpcomm plan --model {model} --tp {tp} --out {out}",
        "topo": f"tpcomm topo --out {out}",
        "probe": f"tpcomm probe --gpus {tp} --model {model} --out {out}",
        "attribute": f"tpcomm attribute --server-url URL --out {out}",
        "attribute_plugin": f"VLLM_PLUGINS=tpcomm vllm serve ... (tpcomm installed in vLLM's environment), then tpcomm attribute --server-url URL --out {out}",
        "predict": f"tpcomm predict --model {model} --tp {tp} --gpu {hw} --probe {out} --out {out}",
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


def plan_per_step(plan: dict | None, batch: int = 1) -> dict[str, Any]:
    """Collectives per decode step at `batch`: count and bytes per op (per rank)."""
    if not plan:
        return {}
    per_op: dict[str, dict[str, float]] = {}
    for c in plan.get("collectives") or []:
        if c.get("batch", batch) != batch:
            continue
        d = per_op.setdefault(c.get("op", "?"), {"count": 0, "bytes": 0})
        d["count"] += c.get("count") or 0
        d["bytes"] += (c.get("count") or 0) * (c.get("bytes") or 0)
    return {"per_op": per_op, "count": sum(d["count"] for d in per_op.values()),
            "bytes": sum(d["bytes"] for d in per_op.values()), "batch": batch}


def layout_text(layout: dict) -> str:
    parts = [f"TP {layout.get('tp', '?')}"]
    parts += [f"{k.upper()} {layout[k]}" for k in ("dp", "pp", "dcp") if (layout.get(k) or 1) > 1]
    if layout.get("ep"):
        parts.append(f"EP {layout.get('ep_size', 'on')}")
    return ", ".join(parts)


def plan_weights(plan: dict, batch: int = 1) -> dict[str, Any]:
    """Weight bytes each GPU reads per decode step at `batch`: total and per component."""
    w = plan.get("weights") or {}
    w = w.get(str(batch)) or w.get(batch) or (next(iter(w.values())) if w and all(isinstance(v, dict) for v in w.values()) else w)
    if not isinstance(w, dict):
        return {}
    return {"total_bytes": w.get("bytes_per_gpu_per_step"), "batch": batch,
            "components": [c for c in w.get("components") or [] if isinstance(c, dict)]}


def plan_sizes(plan: dict | None) -> list[dict[str, Any]]:
    """Distinct (op, bytes) message sizes of the plan, to mark on the probe figure."""
    if not plan:
        return []
    seen: dict[tuple, dict] = {}
    for c in plan.get("collectives") or []:
        key = (c.get("op"), c.get("bytes"))
        if key[1] and key not in seen:
            seen[key] = {"op": key[0], "bytes": key[1], "batch": c.get("batch"), "site": c.get("site")}
    return sorted(seen.values(), key=lambda d: d["bytes"])


# ---- probe ---------------------------------------------------------------
def _col(df, *names: str) -> str | None:
    for n in names:
        if n in df.columns:
            return n
    return None


def probe_table(df) -> dict[str, Any] | None:
    if df is None or len(df) == 0:
        return None
    c_bytes = _col(df, "bytes", "size_bytes", "size")
    c_time = _col(df, "time_us_p50", "p50_us", "time_us", "lat_us_p50", "time_us_median")
    if c_bytes is None or c_time is None:
        return None
    c_bus = _col(df, "busbw_GBps", "busbw_GBps_p50")
    c_alg = _col(df, "algbw_GBps", "algbw_GBps_p50")
    c_p99 = _col(df, "time_us_p99", "p99_us")
    c_wrong = _col(df, "wrong", "n_wrong", "errors")
    keys = [k for k in ("backend", "op", "mode", "timing", "world_size", "dtype") if k in df.columns]
    curves = []
    for gkey, g in (df.groupby(keys, dropna=False, sort=True) if keys else [((), df)]):
        gkey = gkey if isinstance(gkey, tuple) else (gkey,)
        g = g.sort_values(c_bytes)
        pts = [(int(r[c_bytes]), float(r[c_time]), _f(r[c_bus]) if c_bus else None) for _, r in g.iterrows()]
        curves.append({**{k: (None if _isnan(v) else v) for k, v in zip(keys, gkey)}, "points": pts})
    rows = []
    for _, r in df.sort_values(keys + [c_bytes] if keys else [c_bytes]).iterrows():
        rows.append({**{k: r[k] for k in keys}, "bytes": int(r[c_bytes]), "time_us_p50": float(r[c_time]),
                     "time_us_p99": _f(r[c_p99]) if c_p99 else None, "algbw_GBps": _f(r[c_alg]) if c_alg else None,
                     "busbw_GBps": _f(r[c_bus]) if c_bus else None, "wrong": int(r[c_wrong]) if c_wrong and not _isnan(r[c_wrong]) else None})
    cond = []
    for k in ("world_size", "backend", "mode", "timing", "dtype", "device", "hardware", "vllm", "torch"):
        if k in df.columns:
            vals = sorted({str(v) for v in df[k].dropna().unique()})
            if vals:
                cond.append(f"{k} {'/'.join(vals)}")
    return {"curves": curves, "rows": rows, "conditions": "; ".join(cond) or "see probe/results.parquet"}


def fit_rows(fit: dict | None) -> list[dict[str, Any]]:
    """probe/fit.json as rows: one per (backend, op, mode, timing, size segment) with alpha_us, beta_GBps."""
    if not fit:
        return []
    rows: list[dict[str, Any]] = []
    for m in fit.get("models") or []:
        for seg in m.get("segments") or [{}]:
            rows.append({"backend": m.get("backend"), "op": m.get("op"), "mode": m.get("mode"), "timing": m.get("timing"),
                         "bytes": f"{seg.get('min_bytes', 0)}-{seg.get('max_bytes') or 'max'}",
                         "alpha_us": seg.get("alpha_us"), "beta_GBps": seg.get("beta_GBps"), "points": seg.get("points"),
                         "max_rel_err": seg.get("max_rel_err")})
    return rows


def fit_formula(fit: dict | None) -> str | None:
    return (fit or {}).get("formula")


# ---- load / attribution --------------------------------------------------
def levels_list(levels: Any) -> list[dict]:
    if isinstance(levels, dict):
        return list(levels.get("levels") or [])
    return list(levels or [])


def levels_conditions(levels: Any) -> dict | None:
    if isinstance(levels, dict):
        return levels.get("conditions")
    for lv in levels or []:
        if isinstance(lv, dict) and lv.get("conditions"):
            return lv["conditions"]
    return None


COND_KEYS = ("model", "tp", "api", "input_len", "output_len", "requests_per_round", "plugin", "ranks", "backends", "timing",
             "hardware", "world_size")


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


def _plain(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "/".join(str(x) for x in v)
    return str(v)


def serving_config(inp: Inputs) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for cond in (levels_conditions(inp.levels), (inp.attribution or {}).get("conditions")):
        for k, v in (cond or {}).items():
            if not isinstance(v, dict) and k not in {r[0] for r in rows}:
                rows.append((k, _plain(v)))
    return rows


def served_model_name(inp: Inputs) -> str | None:
    for cond in (levels_conditions(inp.levels), (inp.attribution or {}).get("conditions")):
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


def predict_conditions(pred: dict) -> str:
    hw = pred.get("hardware") or {}
    lay = pred.get("layout") or {}
    model = pred.get("model") or {}
    bits = [f"model-based (not measured): {model.get('name', '?')}" + (f" ({model['quantization']})" if model.get("quantization") else ""),
            layout_text(lay), f"hardware {hw.get('name', hw.get('profile', '?'))}"]
    bw = hw.get("memory_bandwidth_GBps") or hw.get("mem_bw_GBps")
    if bw:
        bits.append(f"{bw:g} GB/s memory")
    if hw.get("link"):
        bits.append(f"link {link_text(hw['link'])}")
    bits.append(f"collective latency: {pred.get('collective_latency_source', '?')}")
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


from tpcomm.report.timeline import one_step_timeline  # noqa: E402  (re-exported for analysis.py)
from tpcomm.report.topology import topo_summary  # noqa: E402
