"""The delivery rule: when the API server's part of a token (the fifth term, analysis/delivery.py) is large,
the engine is not what caps the token the client gets; the host or the API server is.

The rule: delivery caps the token when it is at least DELIVERY_SHARE of the client's per-token time (a
quarter: the same "major part" as the interconnect's MAJOR_SHARE). The lever that fits depends on where the
API server's time goes: on a loaded host (the level's CPU pressure high, or held tokens: the API server
sent tokens a hold later than the rest) the API server and the engine core wait for a CPU, so the lever is
cores (free cores for them beside the workers' VLLM_CPU_OMP_THREADS_BIND set, or nothing else busy there);
on an unloaded host it is the API server's own work per token (`--api-server-count`, fewer outputs per
step: the batch). Where the client's own process waited for a CPU more than the API server did (and for a
quarter of the token or more), the holds are the client's: run it on cores or a machine of its own. What it
would give is a bound: the client's per-token time with delivery at zero, which
is the engine's own (the four terms) and no setting goes below.

Units: shares are fractions of the client's per-token time; *_ms milliseconds per token; tok/s one stream.
"""

from __future__ import annotations

from tpcomm.columns import fmt
from tpcomm.judge.bottleneck import pct
from tpcomm.rundir.results import DeliveryTerm, HostLoad, Lever

DELIVERY_SHARE = 0.25


def share(dt: DeliveryTerm | None) -> float | None:
    if dt is None or not dt.measured or not dt.client_ms or dt.ms is None:
        return None
    return dt.ms / dt.client_ms


def caps(dt: DeliveryTerm | None) -> bool:
    s = share(dt)
    return s is not None and s >= DELIVERY_SHARE


def loaded(dt: DeliveryTerm, host: HostLoad | None) -> bool:
    return bool((host and host.high) or dt.held_tokens)


def client_starved(dt: DeliveryTerm, host: HostLoad | None) -> bool:
    """The client's own process waited for a CPU more per token than the API server did, and for at least
    DELIVERY_SHARE of the client's token: the holds are the client's (measured 2026-12-03 on a loaded 2-core
    host: the client 74-76 ms per token summed over its threads, the API server 0.8-0.9 ms)."""
    if host is None or host.client_wait_ms_per_token is None or not dt.client_ms:
        return False
    api = host.api_server_wait_ms_per_token or 0.0
    return host.client_wait_ms_per_token > api and host.client_wait_ms_per_token >= DELIVERY_SHARE * dt.client_ms


def setting(dt: DeliveryTerm, host: HostLoad | None, platform: str | None) -> str:
    """What to set, by where the API server's time goes (see the module docstring)."""
    if client_starved(dt, host):
        return (
            "the client, not the server: run the client on a machine or cores of its own (its process waited "
            f"{fmt(host.client_wait_ms_per_token)} ms per token for a CPU, the API server "
            f"{fmt(host.api_server_wait_ms_per_token)} ms)"
        )
    if loaded(dt, host):
        if platform == "cpu":
            return (
                "give the API server and the engine core cores of their own: VLLM_CPU_OMP_THREADS_BIND on fewer "
                "cores than the machine has (e.g. leave one free), and nothing else busy on the machine"
            )
        return "free CPU cores for the API server and the engine core (nothing else busy on the host's CPUs)"
    return (
        "--api-server-count N (several API server processes beside one engine), or fewer outputs to process per "
        "step (a smaller batch per API server)"
    )


def statement(dt: DeliveryTerm | None, host: HostLoad | None, platform: str | None) -> str | None:
    """The sentence page 1 adds to the verdict when delivery caps the token, else None."""
    if not caps(dt):
        return None
    why = (
        f"{dt.held_tokens} token(s) held over 100 ms"
        + (f", CPU pressure {fmt(host.cpu_pressure_pct)}%" if host and host.cpu_pressure_pct is not None else "")
        if loaded(dt, host)
        else "no hold and no CPU pressure measured: the API server's own work per token"
    )
    return (
        f"The host or the API server caps the token: delivery (output processing, streaming, the event loop, "
        f"held tokens) is {pct(share(dt))}% of what the client saw per token ({fmt(dt.ms)} of {fmt(dt.client_ms)} "
        f"ms; the engine makes one every {fmt(dt.split_ms)} ms; {why}). Lever: {setting(dt, host, platform)}."
    )


def lever(dt: DeliveryTerm | None, host: HostLoad | None, platform: str | None) -> Lever | None:
    """The lever row when delivery caps the token: its effect bounded by delivery at zero."""
    if not caps(dt) or not dt.split_ms:
        return None
    now, best = 1e3 / dt.client_ms, 1e3 / dt.split_ms
    return Lever(
        name="api-server-delivery",
        setting=setting(dt, host, platform),
        tok_per_s=best,
        tok_per_s_range={"low": now, "central": best, "high": best},
        change_pct=100 * (best / now - 1),
        basis="the measured five-term split: at most delivery removed (the client then gets the engine's pace)",
    )
