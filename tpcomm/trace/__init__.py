"""Torch-profiler (Kineto) traces as a second instrument: the hook's record
tables and per-token split read from the traces a user already has.

    reader.py     streaming Kineto reader (plain or gzipped JSON), one trace per rank
    classify.py   which kernels and ops are communication, each rule with a real name and its source
    steps.py      one rank's trace -> the hook's step and collective tables (vLLM step ranges, ProfilerStep#N)
    launches.py   which step and host ops a GPU kernel belongs to (launch correlation, graphs, GPU ranges)
    instances.py  ranks checked and aligned into collective instances (analysis/align.py)
    terms.py      the split (analysis/split.py), the plan cross-check, hook vs trace per term
    export.py     aligned steps and collectives as a Perfetto / chrome://tracing file
    summary.py    trace/summary.json and the terminal tables
    importer.py   the whole `tpcomm trace` job
    cli.py        `tpcomm trace`
"""
