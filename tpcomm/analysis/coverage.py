"""What the hook could not time in the server it ran in, from its status: one line each, for the summary and
the report's page one (collectives it did not time are in no term; their time lands in compute).

- collectives inside CUDA graphs when graph timing was off at start-up (TPCOMM_GRAPH_TIMING, hook/timing.py):
  counted per sampled step (steps.untimed_collectives), so the split says "not measured" rather than zero;
- vLLM kernels that bypass both timed paths (hook/fused.py UNCOVERED) when the served model loaded them;
- timing paths the hook switched off after an error in its own part (hook/failsafe.py, `sites_off` per rank):
  `lost_terms` says which terms of the split they leave unmeasured, for every level of the run.
"""

from __future__ import annotations

# failsafe site -> (what went off, how it failed, the terms it leaves unmeasured). A site not listed here (a
# newer hook's) counts as losing compute, transfer and wait: the split cannot tell what it covered.
_COLL = "compute, transfer and wait"
_ALL = "the per-token time and all its terms"
SITES = {
    "collective": ("collective timing off", "", _COLL),
    "reroute": ("collective timing in compiled graphs off", "reroute failed: ", _COLL),
    "fused_allreduce": ("fused all-reduce + RMSNorm timing off", "", _COLL),
    "graph_capture": ("graph timing off", "capture failed: ", _COLL),
    "graph_replay": ("graph timing off", "replay failed: ", _COLL),
    "device_init": ("CUDA timing off", "set-up failed: ", _COLL),
    "step_begin": ("engine step timing off", "step begin failed: ", _ALL),
    "step_end": ("engine step timing off", "step end failed: ", _ALL),
    "sampling": ("engine step timing off", "sampler's end failed: ", _ALL),
    "backend_tag": ("backend names off (rows name the group's transport)", "", None),
    "publish": ("metrics publishing off (scrapes ask the workers)", "", None),
    "routes": ("the /tpcomm/v1 routes off", "", None),
}


def _sites_off(hook_status: dict | None) -> dict[str, str]:
    """site -> reason over every rank (the lowest rank's reason)."""
    out: dict[str, str] = {}
    for w in sorted(_ranks(hook_status), key=lambda w: w.get("rank", 0) if isinstance(w.get("rank"), int) else 0):
        for site, d in (w.get("sites_off") or {}).items():
            out.setdefault(str(site), str(d.get("reason") if isinstance(d, dict) else d))
    return out


def _ranks(hook_status: dict | None) -> list[dict]:
    return [w for w in (hook_status or {}).get("per_rank") or [] if isinstance(w, dict)]


def merge_sites_off(status: dict | None, later: dict | None) -> None:
    """Add to `status` (the hook's status at the run's start, which the analysis reads) the sites that `later`
    (a status read after a level) lists as off: a site can go off at any call, mid-run."""
    if not isinstance(status, dict) or not isinstance(later, dict):
        return
    seen = {r.get("rank"): r.get("sites_off") or {} for r in later.get("per_rank") or [] if isinstance(r, dict)}
    for r in status.get("per_rank") or []:
        if isinstance(r, dict) and seen.get(r.get("rank")):
            r["sites_off"] = {**seen[r.get("rank")], **(r.get("sites_off") or {})}
    if later.get("sites_off"):
        status["sites_off"] = {**later["sites_off"], **(status.get("sites_off") or {})}


def sites_off_lines(hook_status: dict | None) -> list[str]:
    """One line per switched-off site, e.g. "graph timing off: capture failed: RuntimeError: ..."."""
    out = []
    for site, reason in _sites_off(hook_status).items():
        what, how, lost = SITES.get(site, (f"{site} off", "", _COLL))
        out.append(f"{what}: {how}{reason}" + (f" ({lost} not measured)" if lost else ""))
    return out


def lost_terms(hook_status: dict | None) -> str | None:
    """Why the split is not measured in this run (a site the split needs went off), or None."""
    lost = [(s, r) for s, r in _sites_off(hook_status).items() if SITES.get(s, ("", "", _COLL))[2]]
    if not lost:
        return None
    terms = _ALL if any(SITES.get(s, ("", "", _COLL))[2] == _ALL for s, _ in lost) else _COLL
    what = "; ".join(f"{SITES.get(s, (f'{s} off', '', ''))[0]}: {SITES.get(s, ('', '', ''))[1]}{r}" for s, r in lost)
    return f"{terms} not measured: the hook switched timing off in the server ({what})"


def not_timed(hook_status: dict | None) -> list[str]:
    out: list[str] = []
    ranks = _ranks(hook_status)
    gt = [w.get("graph_timing") for w in ranks if isinstance(w.get("graph_timing"), dict)]
    off = [g for g in gt if g.get("applies") and not g.get("enabled")]
    lost = sorted({g["graph_timing_off_why"] for g in off if g.get("graph_timing_off_why")})
    if lost:  # asked for, and switched off in the workers (start-time self-test, a fault in a capture)
        out.append(f"collectives inside CUDA graphs: graph timing off: {'; '.join(lost)}")
    elif off:
        out.append(
            "collectives inside CUDA graphs: graph timing was off when the server started (TPCOMM_GRAPH_TIMING=1 "
            "in its environment turns it on)"
        )
    seen = set()
    for w in ranks:
        for d in ((w.get("allreduce_fusion") or {}).get("not_covered_detail")) or []:
            live = d.get("loaded_in_worker") and d.get("initialised", True)
            if live and d.get("module") not in seen:
                seen.add(d.get("module"))
                out.append(
                    f"{d.get('what')} ({d.get('module')}, {d.get('models')}): it bypasses the hook's timed paths"
                )
    out += sites_off_lines(hook_status)
    reasons = sorted({str(w["disabled_reason"]) for w in ranks if w.get("disabled_reason")})
    if reasons:
        out.append("the hook switched itself off after an error: " + "; ".join(reasons))
    return out
