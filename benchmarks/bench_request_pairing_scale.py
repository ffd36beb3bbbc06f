"""Pairing by request id at the seed's scale (issue 31): 8 ranks x 123 collectives per step (a 61-layer MLA model's
decode step) x 1300 steps (1.28 M collective rows), 8 streams of 64-token requests (155 requests, 79 k step-request
rows), synthetic records with a known answer (analysis/synthetic.py; every token reaches the client 150 us after
its step ends). Prints the time of the client side with and without the request ids, side by side, and the
five-term check.

    .venv/bin/python benchmarks/bench_request_pairing_scale.py
"""

import time

import pandas as pd

from tpcomm.analysis.align import align
from tpcomm.analysis.attribution import client_side
from tpcomm.analysis.split import assign_levels, rank_steps
from tpcomm.analysis.synthetic import make_records

S, C, N = 1300, 8, 64
coll, st, truth = make_records(steps=S, tp=8, calls=123)
ends = st.groupby("step")["t_end_ns"].mean().sort_index()
steps = ends.index.to_numpy()
e = ends.to_numpy()
sreq, tok, req = [], [], []
rid = 0
for s in range(C):
    a = s * 8
    while a + N <= S:
        for k in range(N):
            sreq += [(r, int(steps[a + k]), rid, 16 if k == 0 else 1) for r in range(8)]
            tok.append((rid, k, int(e[a + k]) + 150_000, 1))
        req.append((rid, N, int(e[a]) - 5_000_000, int(e[a + N - 1]) + 150_000))
        rid += 1
        a += N
sreq = pd.DataFrame(sreq, columns=["rank", "step", "request", "tokens"])
tok = pd.DataFrame(tok, columns=["request_id", "token_idx", "t_ns", "n_tokens"]).assign(concurrency=C, repeat=0)
req = pd.DataFrame(req, columns=["request_id", "output_tokens", "t_start_ns", "t_end_ns"]).assign(
    ok=True, in_stats=True, concurrency=C, repeat=0
)
req["output_tokens"] = req["output_tokens"].astype(float)
first = tok[tok.token_idx == 0].set_index("request_id")["t_ns"]
req["ttft_ms"] = (req["request_id"].map(first) - req["t_start_ns"]) / 1e6
req["e2e_ms"] = (req["t_end_ns"] - req["t_start_ns"]) / 1e6
req["tpot_ms"] = (req["e2e_ms"] - req["ttft_ms"]) / (req["output_tokens"] - 1)
win = [
    {
        "concurrency": C,
        "repeat": 0,
        "t_start_ns": int(st["t_start_ns"].min()),
        "t_end_ns": int(st["t_end_ns"].max()) + 1,
    }
]
t = time.perf_counter()
al = align(coll)
every = rank_steps(al, st)
rows = assign_levels(every, win)
t1 = time.perf_counter() - t
t = time.perf_counter()
cs0 = client_side(rows, req, tok, C, True)
t0 = time.perf_counter() - t
t = time.perf_counter()
cs = client_side(rows, req, tok, C, True, sreq, every)
t2 = time.perf_counter() - t
t = time.perf_counter()
cs_out = client_side(rows, req, tok, C, True, sreq, every, out_rank=0)  # attribute's path: rank 0's step ends
t3 = time.perf_counter() - t
dt, cz = cs["delivery_term"], cs["closure"]
print(
    f"{len(coll):,} collective rows (8 ranks x 123 x {S} steps), {len(sreq):,} step-request rows, {len(req)} requests at C={C}"
)
print(
    f"align+rank_steps {t1:.2f} s; client side without ids {t0:.2f} s, with ids {t2:.2f} s, with ids on the output "
    f"rank's step ends {t3:.2f} s"
)
print(
    f"paired {dt.requests}/{len(req)}; five terms {dt.sum_ms:.4f} vs client {dt.client_ms:.4f} ms ({dt.diff_pct:+.2f}%), delivery {dt.ms:.4f} ms, early {dt.early_tokens}; closure {cz.pairing} {cz.diff_pct:+.2f}%"
)
do, co = cs_out["delivery_term"], cs_out["closure"]
print(
    f"on rank 0's step ends: paired {do.requests}/{len(req)}; five terms {do.sum_ms:.4f} vs client {do.client_ms:.4f} ms "
    f"({do.diff_pct:+.2f}%), delivery {do.ms:.4f} ms, early {do.early_tokens}; closure {co.pairing} {co.diff_pct:+.2f}%"
)
