"""Terminal output of `tpcomm attribute`: a progress bar per level and the
tables. Only draws; every number comes from the result document."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tpcomm.analysis import specdecode
from tpcomm.analysis.closure import closure_text
from tpcomm.attribute.run import Progress as ProgressHooks
from tpcomm.columns import LOAD, SPLIT, fmt, table
from tpcomm.judge import definitions
from tpcomm.rundir import contract as C
from tpcomm.rundir import documents
from tpcomm.rundir.results import Attribution


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


def five_terms_line(a) -> str | None:
    """One level's token as the client saw it: the four engine terms + delivery against the client's own."""
    dt = a.delivery_term
    if dt is None or not dt.measured or a.per_token_ms is None:
        return None
    t = dt.split_terms or a.per_token_ms  # the terms over the same requests' steps: they add up to dt.sum_ms
    check = f"{dt.diff_pct:+.1f}%{dt.of}" if dt.diff_pct is not None else "n/a"
    judged = ("ok" if dt.ok else "[red]FAILED[/red]") if dt.judged else f"not judged: {dt.why_not_judged}"
    if dt.early_tokens:
        judged += f" ({dt.early_tokens} tokens received before the step they were paired with ended: a wrong pairing)"
    load = (
        f"; LOADED HOST (CPU pressure {fmt(a.host_load.cpu_pressure_pct)}%)" if a.host_load and a.host_load.high else ""
    )
    return (
        f"C={a.concurrency} as the client saw it: compute {fmt(t.compute)} + transfer {fmt(t.transfer)} + wait "
        f"{fmt(t.wait)} + host gap {fmt(t.host_gap)} + delivery {fmt(dt.ms)} = {fmt(dt.sum_ms)} vs client "
        f"{fmt(dt.client_ms)} ms per token ({check}, {judged}; {dt.held_tokens} held tokens){load}"
    )


def _rich_table(header: list[str], rows: list[list[str]]) -> Table:
    t = Table(show_lines=False)
    for h in header:
        t.add_column(h, justify="right")
    for r in rows:
        t.add_row(*r)
    return t


def render(res: dict, console: Console | None = None) -> None:
    """The load table and the per-level split, from the same column specs as the report (tpcomm/columns.py)."""
    # Piped output (logs, the demo) has no terminal width: wide enough that numbers are never cut.
    con = console or (Console() if sys.stdout.isatty() else Console(width=220))
    levels = res["levels"]
    cond = levels[0]["conditions"] if levels and levels[0].get("conditions") else {}
    con.print(
        f"[bold]Load[/bold] on {cond.get('server_url')} model {cond.get('model')} ({cond.get('api')}, "
        f"input {cond.get('input_len')} / output {cond.get('output_len')} tokens, client clock)"
    )
    con.print(_rich_table(*table(LOAD, documents.parse(C.LOAD_LEVELS, levels, writing=True))[:2]))
    for lv in levels:
        for flag in lv.get("flags") or []:
            con.print(f"[yellow]! {flag}")
    att = Attribution.from_json(res["attribution"]) if res.get("attribution") else None
    for line in att.not_timed if att is not None else []:
        con.print(f"[yellow]! not timed by the hook: {line}")
    if att is not None and not any(a.attributed for a in att.levels):
        for a in att.levels:  # why each level has no split (the lost terms, no records, ...)
            if a.note:
                con.print(f"[yellow]C={a.concurrency} repeat {a.repeat}: {a.note}")
    if att is not None and (att.plugin or att.source == "trace") and any(a.attributed for a in att.levels):
        c = att.conditions
        # No plugin: the records are the profiled level's torch-profiler traces (analysis/profile_levels.py)
        src = "torch-profiler traces, no plugin" if att.source == "trace" else "hook records"
        con.print(
            f"[bold]Per-token split[/bold] ({src}: TP {c.get('tp')}, backends {', '.join(c.get('backends', []))}, "
            f"timing {', '.join(c.get('timing', []))}; server {_versions(c.get('server_versions'))})"
        )
        con.print(_rich_table(*table(SPLIT, att.levels)[:2]))
        for line in (definitions.TERM["per_token"], definitions.TERM["closure"], definitions.DELIVERY_CELLS):
            con.print(f"[dim]{line}")
        if att.verdict is not None:
            con.print(f"[bold]{att.verdict.statement}")
        for a in att.levels:
            if a.closure:
                for why, ids in a.closure.excluded.items():
                    con.print(
                        f"[dim]C={a.concurrency}: compared on neither side: {why}: {', '.join(map(str, ids[:12]))}"
                    )
            if a.note:
                con.print(f"[yellow]C={a.concurrency} repeat {a.repeat}: {a.note}")
            if text := closure_text(a.concurrency, a.repeat, a.closure, a.stalls, a.delivery_term):
                con.print(f"[red]{text}")
            if text := five_terms_line(a):
                con.print(text)
    for line in att.incomplete() if att is not None else []:
        con.print(f"[red]INCOMPLETE level {line} (no headline from it)")
    notes = list(res.get("notes", []))
    for a in att.levels if att is not None else []:  # what the split's figures are per (a live run's own notes lack it)
        if a.spec_decode is not None and (line := f"C={a.concurrency}: {specdecode.flag(a.spec_decode)}") not in notes:
            notes.append(line)
        sc = a.server_clock  # the window placed on the server's clock (analysis/serverclock.py)
        if sc is not None and sc.placed and (line := f"C={a.concurrency} repeat {a.repeat}: {sc.text()}") not in notes:
            notes.append(line)
    for n in notes:
        con.print(f"[yellow]{n}")
    if res.get("profile"):
        con.print(f"[bold]Profile[/bold]: {res['profile'].get('summary_line', res['profile'])}")
    state = "complete" if res["complete"] else "[red]INCOMPLETE"
    con.print(f"Run directory: {res['run_dir']} ({state})")


def _versions(v):
    if not v:
        return "versions not reported"
    return ", ".join(f"{k} {v[k]}" for k in ("vllm", "torch", "tpcomm") if isinstance(v, dict) and v.get(k))
