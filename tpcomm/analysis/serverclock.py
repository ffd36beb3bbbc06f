"""The server's wall clock against the client's, bounded by one call, and the level's window placed on it.

A level's window (its requests' span) is read on the client's wall clock and cut from the engine's steps,
which the hook stamps on the server's (rank 0's: the ranks are put on it, clocks.py). On one machine the two
are one clock. A client on another machine whose clock is off by more than a request's network time cuts
the wrong steps: with the client 50 ms ahead the C=1 pairing found 11 prefill steps for 12 requests; 2 s
behind, C=4's window took a third of C=2's steps and its per-token time moved 4.5%, with no word said
(the recorded request-id run shifted, 2026-12-07).

The bound: each TP worker stamps `started_ns` (its wall clock) while it serves the level's recording start,
so between the client's send (t0) and its receipt of the answer (t1):

    offset = server clock - client clock  lies in  [started_ns - t1, started_ns - t0]

whatever the network's asymmetry; its width is the call's round trip. A client time t is server time t +
offset, so the level's window [a, b] holds its steps on the server's clock inside [a + lo, b + hi] (at C=1,
where the pairing needs every prefill step of the level), and every step inside [a + hi, b + lo] is in it
(above C=1, where the window is the steady part and a wider one would take in steps of the ramp). Since the
requests are sent after the start answered (a >= t1), a + lo >= started_ns: the moved window never reaches
back before the level's own recording began.

Placement (`place`):
- "moved": the bound excludes 0 (the clocks differ by more than the call's round trip can hide): the window
  becomes [a + lo, b + hi], and the delivery delays are not on one clock;
- "allowed for": the bound holds 0 and the client is on another machine: the window placed as "moved" is,
  the offset the bound leaves possible taken into account (at most one round trip either side);
- "as measured": the bound holds 0 on the server's machine (one clock): the window as the client read it;
- "not measured": no bound (no plugin, an older run, a start that did not answer): the window as read.

Units: *_ns wall clock nanoseconds, *_ms milliseconds.
"""

from __future__ import annotations

from tpcomm.analysis.delivery import one_clock
from tpcomm.rundir.results import ServerClock


def bound_from_start(doc: object, t0_ns: int, t1_ns: int, session: str | None = None, ref_rank: int = 0) -> dict | None:
    """{rank, lo_ms, hi_ms, rtt_ms} from the hook's answer to the recording start (`doc`: its summary, with
    per_rank started_ns) and the client's wall clock just before the call (t0) and just after its answer (t1).
    None where the answer carries no start time for the reference rank (the rank 0 whose clock the analysis
    puts every rank on), where that rank's recording is not this start's (`session`, armed: a disabled hook
    answers with its last start's time, which would move the window back onto an earlier level), or the
    client's clock went backwards over the call (a step: no bound)."""
    if not isinstance(doc, dict) or t1_ns < t0_ns:
        return None
    per = [r for r in doc.get("per_rank") or [] if isinstance(r, dict) and r.get("rank") == ref_rank]
    if not per or (session is not None and (per[0].get("session") != session or per[0].get("armed") is not True)):
        return None
    started = per[0].get("started_ns")
    if not isinstance(started, int) or isinstance(started, bool) or started <= 0:
        return None
    return {
        "rank": ref_rank,
        "lo_ms": (started - t1_ns) / 1e6,
        "hi_ms": (started - t0_ns) / 1e6,
        "rtt_ms": (t1_ns - t0_ns) / 1e6,
    }


def place(window: dict, bound: dict | None, same_machine: bool, outer: bool = True) -> tuple[dict, ServerClock]:
    """(the window on the server's clock, how it was placed). `window`: {t_start_ns, t_end_ns, ...} on the
    client's clock; `bound`: the level's bound_from_start (None: not measured); `same_machine`: the client on
    the server's machine (boot ids), where a bound that holds 0 means one clock. `outer`: the window that
    holds every step the client's window may hold, [a + lo, b + hi] (C=1: the pairing needs each request's
    prefill step in it); else the one that holds only such steps, [a + hi, b + lo] (above C=1 the window is
    the steady part, where all C streams ran: the outer one would take in steps of the ramp)."""
    if not bound or bound.get("lo_ms") is None or bound.get("hi_ms") is None:
        return window, ServerClock("not measured")
    lo, hi = float(bound["lo_ms"]), float(bound["hi_ms"])
    sc = ServerClock("as measured", bound.get("rank"), lo, hi, bound.get("rtt_ms"))
    if sc.resolved:
        sc.placement = "moved"
    elif not same_machine:
        sc.placement = "allowed for"
    else:
        return window, sc
    first, last = (lo, hi) if outer else (hi, lo)
    out = dict(window)
    out["t_start_ns"] = int(window["t_start_ns"] + round(first * 1e6))
    out["t_end_ns"] = int(window["t_end_ns"] + round(last * 1e6))
    if out["t_end_ns"] <= out["t_start_ns"]:  # a window shorter than the round trip: the outer one
        out["t_start_ns"] = int(window["t_start_ns"] + round(lo * 1e6))
        out["t_end_ns"] = int(window["t_end_ns"] + round(hi * 1e6))
    return out, sc


def client_beside(nodes: dict, conditions: dict, rank: int = 0) -> bool:
    """The client ran on the machine of `rank` (whose clock the bound is of): its boot id is that rank's. Runs
    recorded before the client noted its boot id: the server reached on loopback (delivery.one_clock's rule)."""
    if conditions.get("client_boot_id"):
        return (nodes.get(rank) or {}).get("boot_id") == conditions["client_boot_id"]
    return one_clock(nodes, conditions)
