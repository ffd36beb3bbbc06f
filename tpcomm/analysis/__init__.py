"""The analysis core: from a run directory's records to the typed attribution. attribute, trace, compare,
report, predict's calibration and selfcheck call it; it imports only the data model (rundir/, plan/, models/)
and judge/ (tests/test_layering.py).

One module per step:
    align.py          hook records -> collective instances (same step and call_idx across a group)
    clocks.py         the client's and the engine's clocks: offset and its interval
    pairing.py        client tokens -> engine steps (prefill, decode, held bursts)
    split.py          per decode step and per level: compute / transfer / wait / host gap
    closure.py        engine versus client per token over the same tokens; stalls; delivery's interval
    delivery.py       the fifth term: each token's receipt minus the end of the step that made it
    crosscheck.py     observed collectives per decode step versus `tpcomm plan`
    coverage.py       which collective paths the hook timed, which it could not
    hostload.py       CPU pressure and load average as a condition of each level
    specdecode.py     speculative decoding: tokens per decode step, the split per accepted token
    timeline.py       one decode step laid out per rank
    profile_levels.py the profiler route's levels (no plugin): requests and steps from traces
    attribution.py    run directory -> attribution/* (re-runnable offline: analyse_run_dir)
    synthetic.py      schema-true records with a known answer (benchmark, unit tests)
"""
