"""The tolerances and minimum counts every judgement uses, each defined once (analysis, selfcheck and the
definitions the outputs print import them from here; nothing here imports the analysis).

Units: as named (percent, ms, shares of 1, counts of requests).
"""

from __future__ import annotations

# closure: the engine's and the client's time per token over the same tokens (analysis/closure.py)
CLOSURE_TOL_PCT = 10.0  # judged at C=1 within this
MIN_CLOSURE_REQUESTS = 4  # on at least this many requests
INTERVAL_COVERAGE = 0.95  # the p50's distribution-free interval
# stalls: a gap between a request's tokens, counted apart, in no term
STALL_FACTOR = 20.0  # over this many engine periods
STALL_MIN_MS = 100.0  # and at least this long
# the five terms against the client's per-token time (analysis/delivery.py; issue 31's bar)
FIVE_TERM_TOL_PCT = 5.0
FIVE_TERM_MIN_REQUESTS = 6
# A token received this much before the end of the engine step it was paired with (client and server on one
# clock): impossible, so the pairing of tokens to steps is wrong. The hook stamps a step's end when the worker
# leaves it, before the API server can send its token; 1 ms covers reading the clock in two processes.
EARLY_MS = 1.0
HELD_MS = STALL_MIN_MS  # a token delivered this much later than the level's median delay was held
# preemption on CPU ranks (probe's isolated rows, replay's steps): a rank that waited for a CPU longer than
# PREEMPTED_SHARE of a sample or step was preempted in it; a row warns when more than PREEMPTED_WARN of its
# samples or steps were
PREEMPTED_SHARE = 0.10
PREEMPTED_WARN = 0.10
# held streams (analysis/pairing.py)
BURST_GAP_FRACTION = 0.5  # chunks closer than half an engine period arrived in one burst (a backlog flushed)
MIN_OBSERVED = 0.5  # share of a request's tokens that must lie between its first and last burst
