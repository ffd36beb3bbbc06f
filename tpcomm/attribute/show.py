"""Terminal output of `tpcomm attribute`: a progress bar per level and the
tables. Only draws; every number comes from the result document."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tpcomm.attribute.closure import DELIVERY_CELL_NOTE, closure_text, delivery_cell
from tpcomm.attribute.run import Progress as ProgressHooks


class RichProgress(ProgressHooks):
    def __init__(self):
        self.console = Console(stderr=True)
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[fail]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
        )
        self.bar.start()
        self.task = None

    def level_start(self, concurrency, repeat, round_, total):
        desc = f"C={concurrency} repeat {repeat}" + (f" round {round_ + 1}" if round_ else "")
        self.task = self.bar.add_task(desc, total=total, fail="")
        self.failed = 0

    def request_done(self, row):
        if not row["ok"]:
            self.failed += 1
        if self.task is not None:
            self.bar.update(self.task, advance=1, fail=f"[red]{self.failed} failed" if self.failed else "")

    def note(self, text):
        self.console.print(f"[dim]{text}")

    def close(self):
        self.bar.stop()


def _f(v, fmt="{:.2f}"):
    return "-" if v is None else fmt.format(v)


def render(res: dict, console: Console | None = None) -> None:
    # Piped output (logs, the demo) has no terminal width: wide enough that numbers are never cut.
    con = console or (Console() if sys.stdout.isatty() else Console(width=200))
    levels = res["levels"]
    cond = levels[0]["conditions"] if levels else {}
    con.print(
        f"[bold]Load[/bold] on {cond.get('server_url')} model {cond.get('model')} ({cond.get('api')}, "
        f"input {cond.get('input_len')} / output {cond.get('output_len')} tokens, client clock)"
    )
    t = Table(show_lines=False)
    for col in (
        "C",
        "rep",
        "req",
        "failed",
        "out tok/s",
        "TTFT p50 ms",
        "TPOT p50 ms",
        "ITL p50 ms",
        "ITL p99 ms",
        "E2E p50 ms",
        "steady",
        "spread %",
    ):
        t.add_column(col, justify="right")
    for lv in levels:
        t.add_row(
            str(lv["concurrency"]),
            str(lv["repeat"]),
            str(lv["requests"]),
            f"[red]{lv['failed']}" if lv["failed"] else "0",
            _f(lv["output_tok_per_s"], "{:.1f}"),
            _f(lv["ttft_ms_p50"]),
            _f(lv["tpot_ms_p50"]),
            _f(lv["itl_ms_p50"]),
            _f(lv["itl_ms_p99"]),
            _f(lv["e2e_ms_p50"], "{:.1f}"),
            {True: "yes", False: "[red]no", None: "?"}[lv["steady"]],
            _f(lv.get("repeat_spread_pct"), "{:.1f}"),
        )
    con.print(t)
    for lv in levels:
        for flag in lv["flags"]:
            con.print(f"[yellow]! {flag}")
    att = res.get("attribution") or {}
    if att.get("plugin") and any(a.get("per_token_ms") for a in att.get("levels", [])):
        c = att.get("conditions", {})
        con.print(
            f"[bold]Per-token split[/bold] (hook records: TP {c.get('tp')}, backends {', '.join(c.get('backends', []))}, "
            f"timing {', '.join(c.get('timing', []))}; server {_versions(c.get('server_versions'))})"
        )
        t = Table()
        for col in (
            "C",
            "rep",
            "engine ms/token",
            "compute",
            "transfer",
            "wait",
            "host gap",
            "client TPOT p50",
            "held TPOT p50",
            "held p50, no stalls",
            "delivery",
            "closure (judged C=1, 10%)",
            "stalls",
            "comm-only tok/s",
            "collectives/step vs plan",
        ):
            t.add_column(col, justify="right")
        for a in att["levels"]:
            p = a.get("per_token_ms")
            if not p:
                t.add_row(str(a["concurrency"]), str(a["repeat"]), *["-"] * 12, a.get("note", ""))
                continue
            cc, cz, st = a["collectives_per_step"], a.get("closure") or {}, a.get("stalls") or {}
            verdict = "[green]match" if cc["match"] else "[red]MISMATCH" if cc["match"] is False else "not compared"
            closure = (
                "-"
                if cz.get("diff_pct") is None
                else f"{cz['diff_pct']:+.1f}% "
                + {True: "[green]ok", False: "[red]FAILED"}.get(cz.get("ok"), "not judged")
            )
            t.add_row(
                str(a["concurrency"]),
                str(a["repeat"]),
                _f(a["engine_ms_per_token"]),
                _f(p["compute"]),
                _f(p["transfer"]),
                _f(p["wait"]),
                _f(p["host_gap"]),
                _f((a.get("client") or {}).get("tpot_ms_p50")),
                _f((a.get("client") or {}).get("tpot_held_ms_p50")),
                _f(cz.get("client_tpot_ms_p50")),
                delivery_cell(a.get("delivery"), _f),
                closure,
                f"{st.get('count', 0)} ({st.get('total_ms', 0):.0f} ms)",
                _f(a["comm_only_tok_per_s"], "{:.0f}"),
                f"{cc['observed_total']} vs {cc['planned_total'] if cc['planned_total'] is not None else '-'} {verdict}",
            )
        con.print(t)
        con.print(
            "[dim]per-token ms on the server's step clock: mean start-to-start period of consecutive decode steps "
            "in the level's steady window = compute + transfer + wait + host gap (mean over ranks); collective time "
            "= transfer + wait, wait = rank skew. Client TPOT p50 beside it, and the held TPOT p50 (a stream held back "
            f"whole counts by its end-to-end time); {DELIVERY_CELL_NOTE}; stalls "
            "(token gaps > 20 periods) enter no term, and the closure compares the engine with the held TPOT p50 of "
            "the requests without a stall"
        )
        top = next((a["top_sites"] for a in att["levels"] if a.get("top_sites")), [])
        if top:
            con.print(
                "Top collective sites at the first level (per decode step per rank): "
                + "; ".join(
                    f"{s['group']} {s['op']} {s['bytes']} B x{s['count_per_step']:.1f} = {s['time_us_per_step']:.0f} us "
                    f"({s['transfer_us_per_step']:.0f} transfer)"
                    for s in top[:4]
                )
            )
        for a in att["levels"]:
            cc = a.get("collectives_per_step") or {}
            if cc.get("match") is False or cc.get("match") is None:
                con.print(f"[yellow]C={a['concurrency']}: {cc.get('detail', '')}")
            if a.get("note"):
                con.print(f"[yellow]C={a['concurrency']} repeat {a['repeat']}: {a['note']}")
            if text := closure_text(a):
                con.print(f"[red]{text}")
    for n in res.get("notes", []):
        con.print(f"[yellow]{n}")
    if res.get("profile"):
        con.print(f"[bold]Profile[/bold]: {res['profile'].get('summary_line', res['profile'])}")
    state = "complete" if res["complete"] else "[red]INCOMPLETE"
    con.print(f"Run directory: {res['run_dir']} ({state})")


def _versions(v):
    if not v:
        return "versions not reported"
    return ", ".join(f"{k} {v[k]}" for k in ("vllm", "torch", "tpcomm") if isinstance(v, dict) and v.get(k))
