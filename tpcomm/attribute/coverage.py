"""What the hook could not time in the server it ran in, from its status: one line each, for the summary and
the report's page one (collectives it did not time are in no term; their time lands in compute).

- collectives inside CUDA graphs when graph timing was off at start-up (TPCOMM_GRAPH_TIMING, hook/timing.py):
  counted per sampled step (steps.untimed_collectives), so the split says "not measured" rather than zero;
- vLLM kernels that bypass both timed paths (hook/fused.py UNCOVERED) when the served model loaded them.
"""

from __future__ import annotations


def not_timed(hook_status: dict | None) -> list[str]:
    out: list[str] = []
    ranks = [w for w in (hook_status or {}).get("per_rank") or [] if isinstance(w, dict)]
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
    return out
