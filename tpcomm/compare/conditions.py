"""What differs between two runs' conditions, read from each run directory's own files.

One flat list of (section, name, value) per run, the same names in both, so the diff is a join. Where a value
comes from says `source`: the attribution's conditions (what `attribute` saw: the served model, TP, backends
the hook recorded, versions on both sides, load settings), the hook's status (the model config the server
loaded, its fusion and timing settings), plan.json (the planned collectives), topo.json (NCCL_* / VLLM_*
settings and hardware where `tpcomm topo` ran: the server's own environment is not recorded by the hook),
predict.json and meta.json.

Also the model identity: two runs are "the same model" when the shapes that decide the collectives and the
weights agree (architecture, hidden size, layers, heads, vocabulary, experts); another checkpoint of the same
model (another quantization) is the same model with another checkpoint, the case a comparison is for.
"""

from __future__ import annotations

from typing import Any

from tpcomm.columns import fmt
from tpcomm.compare.results import ConditionDiff
from tpcomm.rundir.results import Attribution

# Model shapes that decide collectives and weights: config.json names -> plan.json's `model` names.
IDENTITY = {
    "architecture": "architecture",
    "hidden_size": "hidden_size",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads",
    "vocab_size": "vocab_size",
    "n_routed_experts": "n_routed_experts",
    "num_experts_per_tok": "num_experts_per_tok",
}
ENV_PREFIXES = ("NCCL_", "VLLM_", "CUDA_VISIBLE_DEVICES", "OMP_")
VERSION_KEYS = ("tpcomm", "python", "torch", "vllm", "nccl", "vllm_build", "os")


def model_identity(run) -> dict[str, Any] | None:
    """The model's shapes from the config the server loaded (hook status), else plan.json / predict.json."""
    cfg = (run.hook_status or {}).get("model_config") or {}
    cfg = cfg.get("text_config", cfg) if isinstance(cfg, dict) else {}
    out: dict[str, Any] = {}
    if cfg:
        arch = cfg.get("architectures")
        out["architecture"] = arch[0] if isinstance(arch, list) and arch else arch
        for k in list(IDENTITY)[1:]:
            out[k] = cfg.get(k)
    model = run.plan.model if run.plan else (run.predict.model if run.predict else None)
    for k, pk in IDENTITY.items():
        if out.get(k) is None and getattr(model, pk, None) is not None:
            out[k] = getattr(model, pk)
    # An expert count of None and 0 both mean "dense".
    for k in ("n_routed_experts", "num_experts_per_tok"):
        if not out.get(k):
            out[k] = None
    return out if any(v is not None for v in out.values()) else None


def quantization(run) -> str | None:
    """The checkpoint's quantization: from the config the server loaded when the run has it (both runs of a
    measured comparison then read it from the same place), else plan.json's or predict.json's description."""
    cfg = (run.hook_status or {}).get("model_config") or {}
    if cfg:
        qc = cfg.get("quantization_config")
        if isinstance(qc, dict):
            return str(qc.get("quant_method") or qc.get("format") or "quantized (method not named)")
        return "none"
    q = run.plan.model.quantization if run.plan else None
    if q:
        return q.get("description") or q.get("method")
    return run.predict.model.quantization if run.predict else None


def _dtype(run) -> str | None:
    cfg = (run.hook_status or {}).get("model_config") or {}
    d = cfg.get("dtype") or cfg.get("torch_dtype")
    if d:
        return str(d)
    return run.plan.model.dtype if run.plan else None


def facts(run) -> list[tuple[str, str, Any, str]]:
    """(section, name, value, source) of one run."""
    att: Attribution | None = run.attribution
    cond = att.conditions if att else {}
    out: list[tuple[str, str, Any, str]] = []
    add = lambda sec, name, v, src: out.append((sec, name, v, src))  # noqa: E731
    ident = model_identity(run) or {}
    for k, v in ident.items():
        add("model", k, v, "hook/status.json model config, else plan.json")
    add("model", "served name", cond.get("model"), "attribution conditions")
    add(
        "model",
        "checkpoint path",
        cond.get("model_root") or (run.plan.model.source if run.plan else None),
        "attribution conditions / plan.json",
    )
    add("model", "quantization", quantization(run), "hook/status.json model config, else plan.json or predict.json")
    add("model", "dtype", _dtype(run), "hook/status.json model config, else plan.json")
    layout = run.plan.layout if run.plan else (run.predict.layout if run.predict else None)
    add("layout", "tp", cond.get("tp") or (layout.tp if layout else None), "attribution conditions / plan.json")
    for k in ("ep", "dp", "pp", "dcp") if layout else ():
        add("layout", k, getattr(layout, k), "plan.json / predict.json")
    add("backends", "backends seen by the hook", cond.get("backends"), "attribution conditions")
    add("backends", "timing", cond.get("timing"), "attribution conditions")
    add("backends", "clock", sorted({lv.clock for lv in att.levels if lv.attributed}) if att else None, "summary")
    hs = run.hook_status or {}
    per = (hs.get("per_rank") or [{}])[0] if isinstance(hs.get("per_rank"), list) else {}
    fusion = per.get("allreduce_fusion") or {}
    for k in ("fusion_pass_configured", "compilation_mode", "batch_invariant"):
        if k in fusion:
            add("settings", f"hook: {k}", fusion.get(k), "hook/status.json")
    if "graph_sample_every" in per:
        add("settings", "hook: graph_sample_every", per.get("graph_sample_every"), "hook/status.json")
    env = (run.topo.env if run.topo else None) or {}
    for k in sorted(env):
        if k.startswith(ENV_PREFIXES):
            add("settings", k, env[k], "topo.json (where `tpcomm topo` ran)")
    for side in ("server_versions", "client_versions"):
        v = cond.get(side) or {}
        for k in VERSION_KEYS:
            if k in v:
                add("versions", f"{side.split('_')[0]} {k}", v[k], "attribution conditions")
    if not cond and run.meta:
        for k in VERSION_KEYS:
            add("versions", k, run.meta.versions.get(k), "meta.json")
    add("hardware", "summary", run.topo.summary if run.topo else None, "topo.json")
    sv = cond.get("server_versions") or {}
    add("hardware", "server cpu_count", sv.get("cpu_count"), "attribution conditions")
    if run.predict:
        hw = run.predict.hardware
        add("hardware", "predict profile", hw.name or hw.profile, "predict.json")
    plan_by_level = _plan_rows(att)
    for k, v in plan_by_level.items():
        add("plan", k, v, "summary (the plan cross-check per level)")
    totals = (run.plan.totals if run.plan else None) or {}
    for batch, ops in sorted(totals.items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else 0):
        per = "; ".join(f"{t.get('count')} x {op}, {t.get('bytes')} bytes" for op, t in sorted((ops or {}).items()))
        add("plan", f"plan.json per step at batch {batch}", per or "none", "plan.json")
    for k in ("api", "input_len", "output_len", "requests_per_round", "prompt"):
        if k in cond:
            add("load", k, cond.get(k), "attribution conditions")
    if att:
        for lv in att.levels:
            w = lv.window or {}
            span = (w["t_end_ns"] - w["t_start_ns"]) / 1e9 if w else None
            n = lv.closure.requests if lv.closure else None
            what = (
                f"{lv.decode_pairs} decode steps, {n} compared requests, {span:.1f} s"
                if lv.attributed and span is not None
                else (lv.note or "no split")
            )
            add("load", f"C={lv.concurrency} repeat {lv.repeat} window", what, "summary")
            cw = f"{fmt(lv.cpu_wait.ms_per_step)} ms per engine step" if lv.cpu_wait else "not measured"
            add("load", f"C={lv.concurrency} repeat {lv.repeat} ranks' CPU wait", cw, "summary (hook: schedstat)")
            h = lv.host_load
            ref = (
                f"mean {fmt(h.reference_ms)} ms (the slowest 2 left out), median {fmt(h.reference_median_ms)} ms (18 runs)"
                if h and h.reference_ms is not None
                else "not measured"
            )
            add("load", f"C={lv.concurrency} repeat {lv.repeat} host's reference work", ref, "summary (client)")
            oth = (
                f"{h.others_cpu_pct:.1f}% of the machine's CPU (steal {h.steal_pct or 0.0:.1f}%)"
                if h and h.others_cpu_pct is not None
                else "not measured"
            )
            add("load", f"C={lv.concurrency} repeat {lv.repeat} others' CPU", oth, "summary (client: /proc)")
    return out


def _plan_rows(att: Attribution | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for lv in att.levels if att else []:
        cc = lv.collectives_per_step or {}
        for side in ("planned", "observed"):
            rows = cc.get(side) or []
            if rows:
                batch = f"batch {cc['batch']}: " if cc.get("batch") is not None else ""
                out[f"C={lv.concurrency} {side} per step"] = batch + "; ".join(
                    f"{r.get('count')} x {r.get('op')} {r.get('group')} {r.get('bytes')} B" for r in rows
                )
            elif side in cc:
                out[f"C={lv.concurrency} {side} per step"] = "none"
    return out


def diff(a, b) -> list[ConditionDiff]:
    """Every condition of either run, in A's order then B's extras; `same` when both hold the same value."""
    fa, fb = facts(a), facts(b)
    vb = {(s, n): (v, src) for s, n, v, src in fb}
    seen, out = set(), []
    for s, n, v, src in fa:
        w, _ = vb.get((s, n), (None, src))
        out.append(ConditionDiff(s, n, _plain(v), _plain(w), _plain(v) == _plain(w), src))
        seen.add((s, n))
    for s, n, w, src in fb:
        if (s, n) not in seen:
            out.append(ConditionDiff(s, n, None, _plain(w), w is None, src))
    return [c for c in out if not (c.a is None and c.b is None)]


def _plain(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v
