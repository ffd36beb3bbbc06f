"""`tpcomm attribute`: drive load on a vLLM server, pull the tpcomm hook's
records, align them across ranks and steps, and split each token's latency
into compute, collective transfer, collective wait and host overhead.

Data flow (one module per step):
    server.py      what the server is: reachable, OpenAI-compatible, model, auth, plugin
    load.py        the streaming load generator (client-side timings per request and token)
    levels.py      per level: throughput, percentiles, steadiness, repeat spread, bursty delivery
    records.py     the hook's /tpcomm/v1 routes -> hook/*.parquet tables
    ranks.py       watch the TP workers during a level: a worker that dies is named (rank, pid, when)
    align.py       hook records -> collective instances (same step and call_idx across a group)
    split.py       per decode step and per level: compute / transfer / wait / host overhead
    crosscheck.py  observed collectives per decode step versus `tpcomm plan`
    analysis.py    run directory -> attribution/* (re-runnable offline: analyse_run_dir)
    profile.py     optional torch-profiler traces: communication ops/kernels versus the hook
    run.py         the whole job, writing into the run directory as it goes
    show.py        progress bars and tables (rich); cli.py the click command
    synthetic.py   schema-true records with a known answer (benchmark, unit tests)
"""
