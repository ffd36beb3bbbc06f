"""The one-line definitions every output prints where it uses a term, built from the constants the analysis
and the judgements use (so "10%" or "20 periods" never drift from the code).

Units: as in the text of each line.
"""

from __future__ import annotations

from tpcomm.judge.bottleneck import BOTTLENECK_SHARE, MAJOR_SHARE
from tpcomm.judge.tolerances import (
    BURST_GAP_FRACTION,
    CLOSURE_TOL_PCT,
    FIVE_TERM_MIN_REQUESTS,
    FIVE_TERM_TOL_PCT,
    INTERVAL_COVERAGE,
    MIN_CLOSURE_REQUESTS,
    MIN_OBSERVED,
    STALL_FACTOR,
    STALL_MIN_MS,
)
from tpcomm.terms import ENGINE

ENABLE_HINT = (
    "interconnect attribution needs the tpcomm plugin in the server: install tpcomm in the server's "
    "environment and start it with\n  TPCOMM_HOOK=1 python -m vllm.entrypoints.openai.api_server "
    "--model {model} --tensor-parallel-size {tp}\n(a server that sets VLLM_PLUGINS, an allow-list, must list "
    "tpcomm in it too)"
)


def enable_hint(model: str = "MODEL", tp: int | str = "N") -> str:
    """How to start a server with the plugin (every output that finds none prints this)."""
    return ENABLE_HINT.format(model=model, tp=tp)


TERM = {
    "per_token": "per-token time: the mean period of the decode steps, each from the end of the step before it to its own end "
    "(one token per stream per step)",
    **{t.name: t.definition for t in ENGINE},  # tpcomm/terms.py
    "closure": (
        f"closure: per request, the engine's and the client's time per token over the same tokens, p50 over the "
        f"same requests; judged at C=1 within {CLOSURE_TOL_PCT:g}% (at least {MIN_CLOSURE_REQUESTS} requests)"
    ),
    "delivery": (
        f"delivery: p50 over those requests of client - engine time per token (API server, network, client), "
        f"with the p50's {INTERVAL_COVERAGE:.0%} distribution-free interval"
    ),
    "delivery_term": (
        "delivery (fifth term): per token, the client's receipt minus the end of the engine step that made it "
        "(API server output processing, streaming, event loop, network, client; held tokens included), pooled "
        f"by token over the C=1 requests paired with their steps; with the four engine terms over the same "
        f"requests it adds up to the client's per-token time, judged within {FIVE_TERM_TOL_PCT:g}% on at least "
        f"{FIVE_TERM_MIN_REQUESTS} requests (what is left is the pairing of tokens to steps)"
    ),
    "held": (
        f"held stream: tokens arriving within {BURST_GAP_FRACTION:g} of an engine period of each other count as one "
        f"burst, at its last token; a request whose bursts span less than {MIN_OBSERVED:.0%} of its tokens was held "
        "back by the API server and is compared on neither side"
    ),
    "stall": (
        f"stall: a gap between a request's tokens over {STALL_FACTOR:g} engine periods and at least "
        f"{STALL_MIN_MS:g} ms; counted apart, in no term; the tokens it held back are compared on neither side"
    ),
    "bottleneck": (
        f"bottleneck rule: the interconnect is the bottleneck when transfer is at least {BOTTLENECK_SHARE:.0%} of "
        f"each token (more than everything else together), a major part from {MAJOR_SHARE:.0%}; wait is rank "
        "skew, which a faster link does not remove"
    ),
    "clock_host": "clock: the host's (step start/end as the worker saw them; collectives timed on the host)",
    "clock_gpu": "clock: the GPU's (step start/end as events on the GPU timeline; collectives timed by CUDA events)",
}
DELIVERY_CELLS = (
    "delivery cells: the figure when its interval excludes 0; n.s. (interval): not separable from zero; n.r.: "
    "fewer than 6 requests, no 95% interval; n/a: not measured"
)


def clock(name: str | None) -> str:
    return TERM["clock_gpu"] if name == "gpu" else TERM["clock_host"]
