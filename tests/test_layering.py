"""The package picture of DESIGN.md, checked against the imports in the tree: no two packages import each other
(directly or round a longer cycle), and the analysis core and the judgements import only the data model.

A package is a directory under tpcomm/; a module at tpcomm/'s top level (errors.py, columns.py, demo.py, ...)
is a node of its own. Imports inside functions count as much as those at the top of a module.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "tpcomm"

# What the analysis core and judge/ may import: the data model (rundir/, the plan of collectives a layout
# issues, the model families it is built from) and the top-level helpers that import nothing of tpcomm's
# command packages.
DATA_MODEL = {
    "rundir",
    "plan",
    "models",
    "topo",
    "terms",
    "errors",
    "columns",
    "jsonsafe",
    "redact",
    "versions",
    "table",
    "backends",
}
ALLOWED = {
    "judge": DATA_MODEL,
    "analysis": DATA_MODEL | {"judge"},
    "rundir": {"terms", "errors", "jsonsafe", "redact", "versions", "procid"},
}


def node(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "tpcomm" or len(parts) < 2:
        return None
    return parts[1]


def graph() -> dict[str, dict[str, set[str]]]:
    """{package: {imported package: {"file:line", ...}}} over every tpcomm import in tpcomm/."""
    edges: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for f in ROOT.rglob("*.py"):
        rel = f.relative_to(ROOT)
        src = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        for n in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                mods = [n.module] if n.module != "tpcomm" else [f"tpcomm.{a.name}" for a in n.names]
            elif isinstance(n, ast.Import):
                mods = [a.name for a in n.names]
            else:
                continue
            for m in mods:
                dst = node(m)
                if dst and dst != src and dst != "__init__":
                    edges[src][dst].add(f"{rel}:{n.lineno}")
    return edges


def cycles(edges) -> list[list[str]]:
    """Each strongly connected set of two or more nodes (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def test_no_package_imports_another_that_imports_it_back():
    edges = graph()
    found = cycles(edges)
    where = {
        tuple(c): {f"{a}->{b}": sorted(edges[a][b])[:3] for a in c for b in c if b in edges.get(a, {})} for c in found
    }
    assert not found, where


def test_the_analysis_core_and_the_judgements_import_only_the_data_model():
    edges = graph()
    wrong = {
        (pkg, dst): sorted(edges[pkg][dst])[:3]
        for pkg, allowed in ALLOWED.items()
        for dst in edges.get(pkg, {})
        if dst not in allowed
    }
    assert not wrong, wrong


def test_the_cycle_finder_finds_a_cycle():
    """The check above can fail: a planted two- and three-package cycle is found, an acyclic graph is not."""
    assert cycles({"a": {"b": set()}, "b": {"a": set()}}) == [["a", "b"]]
    assert cycles({"a": {"b": set()}, "b": {"c": set()}, "c": {"a": set()}, "d": {"a": set()}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b": set()}, "b": {"c": set()}}) == []
