"""Ranks on several hosts put on one clock, from the collectives themselves.

The transfer/wait split uses each rank's own durations and needs no common clock. The per-rank timeline,
the entry skew that names the rank arriving last, window assignment and exports compare timestamps across
ranks; on two hosts those come from two clocks that NTP keeps apart by tens of microseconds to
milliseconds, the same order as the collectives.

Every rank leaves a blocking collective at nearly the same moment (the last to arrive completes it for
all), so for every complete instance the difference of a rank's exit time and the reference rank's (rank
0's, whose host also runs the API server and the client's clock in a one-host test) is that rank's clock
offset plus exit jitter. The offset is the median over instances; its uncertainty the median's
distribution-free interval (order statistics, as for delivery) and the spread (half the interquartile
range) of the per-instance differences.

Which ranks get their offset applied: a rank on another machine (a boot id other than rank 0's: another
kernel, another clock) always; a rank on rank 0's machine only when its offset is resolved (the interval
excludes 0) and larger than SAME_HOST_MIN_US, which only a per-process clock (libfaketime, a container with
its own time namespace) produces. Applied by subtracting it from that rank's t_start_ns/t_end_ns.

Units: *_ns wall clock nanoseconds, *_us microseconds.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tpcomm.analysis.closure import median_interval

SAME_HOST_MIN_US = 50.0  # below it, a same-machine rank's estimate is exit jitter, not another clock
MIN_INSTANCES = 20


def ranks_nodes(hook_status: dict | None) -> dict[int, dict]:
    """rank -> {host, boot_id, pid} from the hook's status (per_rank: host and identity '<boot>/<pid>/<start>')."""
    out: dict[int, dict] = {}
    for w in (hook_status or {}).get("per_rank") or []:
        if not isinstance(w, dict) or not isinstance(w.get("rank"), int):
            continue
        ident = w.get("identity")
        out[w["rank"]] = {
            "host": w.get("host"),
            "boot_id": ident.split("/")[0] if isinstance(ident, str) else None,
            "pid": w.get("pid"),
        }
    return out


def estimate(aligned: pd.DataFrame, ref_rank: int = 0) -> dict[int, dict]:
    """Per rank (other than `ref_rank`): offset_us (its clock minus the reference's), lo_us/hi_us (the median's
    interval), coverage, spread_us (half the IQR of the per-instance differences), instances."""
    a = aligned[aligned["complete"]] if "complete" in aligned.columns else aligned
    if a.empty or ref_rank not in set(a["rank"]):
        return {}
    ends = a.pivot_table(index="instance", columns="rank", values="t_end_ns", aggfunc="first")
    out = {}
    for r in ends.columns:
        if r == ref_rank:
            continue
        d = ((ends[r] - ends[ref_rank]).dropna() / 1e3).to_numpy(dtype=float)
        if d.size < MIN_INSTANCES:
            continue
        iv = median_interval(d)
        q1, q3 = np.percentile(d, [25, 75])
        out[int(r)] = {
            "offset_us": float(np.median(d)),
            "lo_us": iv[0],
            "hi_us": iv[1],
            "coverage": iv[2],
            "spread_us": float(q3 - q1) / 2,
            "instances": int(d.size),
        }
    return out


def decide(offsets: dict[int, dict], nodes: dict[int, dict], ref_rank: int = 0) -> dict[int, dict]:
    """Mark each estimate `applied` (and why): see the module docstring."""
    ref_boot = (nodes.get(ref_rank) or {}).get("boot_id")
    for r, o in offsets.items():
        boot = (nodes.get(r) or {}).get("boot_id")
        other_machine = boot is not None and ref_boot is not None and boot != ref_boot
        resolved = o["lo_us"] > 0 or o["hi_us"] < 0
        if other_machine:
            o["applied"], o["why"] = True, "another machine (boot id): another clock"
        elif resolved and abs(o["offset_us"]) > SAME_HOST_MIN_US:
            o["applied"], o["why"] = (
                True,
                (f"rank 0's machine, but its clock is {o['offset_us']:+.0f} us off (a per-process clock)"),
            )
        else:
            o["applied"], o["why"] = False, "rank 0's clock (same machine; the estimate is exit jitter)"
        o["host"] = (nodes.get(r) or {}).get("host")
    return offsets


def apply(df: pd.DataFrame | None, offsets: dict[int, dict], cols=("t_start_ns", "t_end_ns")) -> pd.DataFrame | None:
    """`df` with each applied rank's offset taken off its timestamps (onto the reference rank's clock)."""
    if df is None or df.empty or not any(o.get("applied") for o in offsets.values()):
        return df
    shift = df["rank"].map({r: int(round(o["offset_us"] * 1e3)) for r, o in offsets.items() if o.get("applied")})
    shift = shift.fillna(0).astype(np.int64)
    out = df.copy()
    for c in cols:
        if c in out.columns:
            out[c] = out[c].astype(np.int64) - shift
    return out


def entry_skew_separable(offsets: dict[int, dict]) -> float | None:
    """The largest uncertainty (us) of an applied offset: an entry skew below it cannot name the rank that
    arrived last across those clocks. None when no offset was applied (one clock)."""
    applied = [
        max(abs(o["hi_us"] - o["offset_us"]), abs(o["offset_us"] - o["lo_us"]))
        for o in offsets.values()
        if o.get("applied")
    ]
    return max(applied) if applied else None
