"""Observed collectives per decode step versus `tpcomm plan` for the served
model and layout. A mismatch is reported with its detail, never hidden: it
means either the plan misses something vLLM does or the server runs a
different layout or code path than assumed.

The model's config is the one the server reports (the hook's status carries
the workers' vllm_config.model_config.hf_config), or --model-config when the
user gives one; never a path resolved on the client, where a folder of the
same name may hold another model. TP from the hook's records (group_size of
the tp group).

Units: bytes per rank per call; counts per decode step per rank.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pandas as pd

# The plan names a point-to-point transfer once (send_recv); the hook records each end (send on the sender).
OP_AS_PLANNED = {"send": "send_recv", "recv": "send_recv"}


def observed_per_step(aligned: pd.DataFrame, decode_steps: pd.DataFrame) -> dict:
    """The most common per-step signature {(group, op, bytes): count} on the lowest rank, how common it is, and the
    tokens its steps carried (`batch`, what the plan is asked at: one per sequence, or under speculative decoding
    1 + each sequence's drafts, which the collectives carry too). Point-to-point ends are named as the plan names
    the transfer (OP_AS_PLANNED)."""
    if decode_steps.empty:
        return {"signature": {}, "share": None, "steps": 0, "batch": None}
    width = "num_tokens" if "num_tokens" in decode_steps.columns else "num_seqs"
    if aligned.empty:  # no collective in any decode step (TP 1): every step has the empty signature
        batch = decode_steps[width].mode()
        return {
            "signature": {},
            "share": 1.0,
            "steps": len(decode_steps),
            "batch": int(batch.iloc[0]),
            "distinct_signatures": 1,
        }
    ref = aligned["rank"].min()
    a = aligned[(aligned["rank"] == ref) & aligned["step"].isin(decode_steps["step"])]
    sigs = Counter()
    batch_of = {}
    seqs = decode_steps.set_index("step")[width].to_dict()
    for step, g in a.groupby("step"):
        ops = g["op"].map(lambda o: OP_AS_PLANNED.get(o, o))
        sig = tuple(sorted(Counter(zip(g["group"], ops, g["bytes"].astype(int))).items()))
        sigs[sig] += 1
        batch_of.setdefault(sig, Counter())[seqs.get(step)] += 1
    steps_with = len(decode_steps)
    steps_without = steps_with - sum(sigs.values())
    if steps_without > 0:
        sigs[()] += steps_without
    sig, n = sigs.most_common(1)[0]
    batch = batch_of.get(sig, Counter({None: 1})).most_common(1)[0][0]
    return {
        "signature": {k: v for k, v in sig},
        "share": n / max(steps_with, 1),
        "steps": steps_with,
        "batch": int(batch) if batch is not None else None,
        "distinct_signatures": len(sigs),
    }


SERVER = "server-reported"
OPTION = "--model-config"


def plan_config(model_source: str | Path | dict | None, hook_status: dict | None) -> tuple[str | dict | None, dict]:
    """(what to plan from, where it came from {source, path, text}): an explicit config (--model-config) first,
    else the config the server's hook reported; source None and the reason when neither exists."""
    if isinstance(model_source, dict):
        return model_source, {"source": "dict", "path": None, "text": "plan from a config given as a dict"}
    if model_source:
        return str(model_source), {
            "source": OPTION,
            "path": str(model_source),
            "text": f"plan from {OPTION} {model_source}",
        }
    cfg = (hook_status or {}).get("model_config")
    if isinstance(cfg, dict) and cfg:
        arch = (cfg.get("architectures") or ["?"])[0]
        return cfg, {
            "source": SERVER,
            "path": None,
            "text": f"plan from the config the server reported ({arch}, {cfg.get('dtype', '?')})",
        }
    why = (
        "the server's hook reported no model config (a tpcomm hook that predates it, or the plugin off)"
        if hook_status
        else "no hook status in this run"
    )
    return None, {"source": None, "path": None, "text": f"no model config to plan from: {why}; pass {OPTION} PATH"}


def planned_per_step(
    model_source: str | Path | dict | None,
    tp: int | None,
    batch: int | None,
    label: str | None = None,
    pp: int = 1,
    stage: int = 0,
) -> tuple[dict | None, str, dict]:
    """({(group, op, bytes): count} from tpcomm.plan or None, how it was made or why not, {(group, op, bytes): [sites]}).
    `model_source`: a config path or dict (see plan_config); `label` names it in the note."""
    label = label or (f"the {SERVER} model config" if isinstance(model_source, dict) else str(model_source))
    if model_source is None:
        return None, f"no model config to plan from; pass {OPTION} PATH", {}
    if not tp:
        return None, "tensor-parallel size unknown (no tp group in the hook records)", {}
    try:
        from tpcomm.plan import build_plan

        src = model_source if isinstance(model_source, dict) else str(model_source)
        doc = build_plan(src, tp=tp, pp=pp, batches=[batch or 1]).to_dict()
    except Exception as e:  # the plan is a separate component: its failure is reported, not fatal
        return None, f"tpcomm plan failed for {label} tp={tp}: {type(e).__name__}: {e}", {}
    out: Counter = Counter()
    sites: dict = {}
    for c in doc.get("collectives", []):
        if c.get("batch", batch or 1) != (batch or 1):
            continue
        if pp > 1 and c.get("pp_stage") not in (None, stage):  # the lowest rank's stage, as observed
            continue
        key = (c.get("group", "tp"), c["op"], int(c["bytes"]))
        out[key] += int(c["count"])
        sites.setdefault(key, []).append(f"{c.get('site', '?')} x{c['count']}")
    where = f" pp={pp} stage {stage}" if pp > 1 else ""
    return dict(out), f"tpcomm plan of {label} tp={tp}{where} batch={batch or 1}", sites


def compare(observed: dict, planned: dict | None, plan_note: str) -> dict:
    obs = observed["signature"]
    doc = {
        "observed": [{"group": g, "op": o, "bytes": b, "count": n} for (g, o, b), n in sorted(obs.items())],
        "observed_total": int(sum(obs.values())),
        "observed_share_of_steps": observed["share"],
        "batch": observed["batch"],
        "planned": None,
        "planned_total": None,
        "match": None,
        "detail": plan_note,
    }
    if planned is None:
        doc["detail"] = "not compared: " + plan_note
        return doc
    doc["planned"] = [{"group": g, "op": o, "bytes": b, "count": n} for (g, o, b), n in sorted(planned.items())]
    doc["planned_total"] = int(sum(planned.values()))
    diffs = []
    for key in sorted(set(obs) | set(planned)):
        o, p = obs.get(key, 0), planned.get(key, 0)
        if o != p:
            g, op, b = key
            diffs.append(f"{g} {op} {b} B: observed {o}/step, planned {p}/step")
    doc["match"] = not diffs
    doc["detail"] = f"matches {plan_note}" if not diffs else "MISMATCH vs " + plan_note + ": " + "; ".join(diffs)
    if observed["share"] is not None and observed["share"] < 0.9:
        doc["detail"] += f" (only {observed['share']:.0%} of decode steps have the observed pattern)"
    return doc


def pp_from_records(coll: pd.DataFrame) -> int:
    """Pipeline stages: the size of the pp group the records name (1 without one)."""
    pp = coll.loc[coll["group"] == "pp", "group_size"] if not coll.empty else pd.Series(dtype=int)
    return int(pp.mode().iloc[0]) if len(pp) else 1


def tp_from_records(coll: pd.DataFrame, status: dict | None = None) -> int | None:
    tp = coll.loc[coll["group"] == "tp", "group_size"] if not coll.empty else pd.Series(dtype=int)
    if len(tp):
        return int(tp.mode().iloc[0])
    pp = pp_from_records(coll)
    if pp > 1:  # PP without a tp group: one rank per stage
        return max(1, coll["rank"].nunique() // pp)
    if coll.empty and status and status.get("ranks") == [0]:
        return 1  # one worker and no collective at all: TP 1
    if status:
        for k in ("tp", "tp_size", "tensor_parallel_size"):
            if isinstance(status.get(k), int):
                return status[k]
    return None
