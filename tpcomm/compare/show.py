"""Terminal output of `tpcomm compare`: the same blocks as the report (tables.py), drawn with rich."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tpcomm.compare.results import Comparison
from tpcomm.compare.tables import sections

STYLE = {"headline": "bold", "warning": "bold red", "small": "dim", "text": ""}


def render(cmp: Comparison, console: Console | None = None) -> None:
    # Piped output (CI logs) has no terminal width: wide enough that numbers are never cut.
    con = console or (Console() if sys.stdout.isatty() else Console(width=200))
    for title, blocks in sections(cmp):
        if title == "Method":
            continue  # in the report and compare.json; the terminal keeps to the figures
        con.rule(f"[bold]{escape(title)}")
        for item in blocks:
            kind = item[0]
            if kind == "table":
                header, rows, _ = item[1]
                t = Table(show_lines=False)
                for h in header:
                    t.add_column(escape(h), justify="right")
                for r in rows:
                    t.add_row(*(escape(c) for c in r))
                con.print(t)
            elif kind in STYLE:
                style = STYLE[kind]
                con.print(f"[{style}]{escape(item[1])}[/{style}]" if style else escape(item[1]))
