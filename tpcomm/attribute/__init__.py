"""`tpcomm attribute`: drive load on a vLLM server, pull the tpcomm hook's records into the run directory
and hand them to the analysis core (tpcomm/analysis/), which splits each token's latency into compute,
collective transfer, collective wait, host gap and delivery.

The driver (one module per step):
    server.py       what the server is: reachable, OpenAI-compatible, model, auth, plugin
    hook_client.py  the one client of the hook's /tpcomm/v1 routes (status, start, stop, records)
    load.py         the streaming load generator (client-side timings per request and token)
    levels.py       per level: throughput, percentiles, steadiness, repeat spread, bursty delivery
    records.py      the hook's routes -> hook/*.parquet tables
    ranks.py        watch the TP workers during a level: a worker that dies is named (rank, pid, when)
    profile.py      optional torch-profiler traces: communication ops/kernels versus the hook
    run.py          the whole job, writing into the run directory as it goes
    show.py         progress bars and tables (rich); cli.py the click command
"""
