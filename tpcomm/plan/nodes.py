"""Which of a plan's collectives cross nodes, for a layout spread over `nnodes` machines.

vLLM numbers the global ranks as arange(world).reshape(-1, DP, PP, PCP, TP) (distributed/parallel_state.py,
initialize_model_parallel: TP innermost, then the pipeline stages, then DP), and with the multiprocessing
executor's `--nnodes N` each node holds world / N consecutive ranks (node_rank * local_world + local rank).
A group crosses nodes when its ranks are not all on one node: TP when tp > ranks per node, the PP send/recv
between stages s and s+1 when their TP blocks lie on different nodes, DP+EP dispatch/combine when the
DP x TP block spans nodes.

Units: ranks.
"""

from __future__ import annotations

from tpcomm.errors import InputError
from tpcomm.plan.layout import Layout


def node_of(rank: int, world: int, nnodes: int) -> int:
    return rank // (world // nnodes)


def _ranks(lay: Layout):
    """(dp, pp, tp) -> global rank, as vLLM lays them out (PCP 1)."""
    return lambda d, p, t: (d * lay.pp + p) * lay.tp + t


def groups(lay: Layout, nnodes: int) -> dict[str, dict]:
    """Per group kind: how many of its groups cross nodes, and the nodes one group spans at most."""
    world = lay.world_size
    if nnodes < 1 or world % nnodes:
        raise InputError(
            f"--nnodes {nnodes}", f"does not divide the world size {world}", "a node count dividing TP x PP x DP"
        )
    r = _ranks(lay)

    def span(members: list[int]) -> int:
        return len({node_of(x, world, nnodes) for x in members})

    tp = [span([r(d, p, t) for t in range(lay.tp)]) for d in range(lay.dp) for p in range(lay.pp)]
    pp = [  # one boundary per (dp, stage pair): the two stages' TP blocks
        span([r(d, p, t) for t in range(lay.tp)] + [r(d, p + 1, t) for t in range(lay.tp)])
        for d in range(lay.dp)
        for p in range(lay.pp - 1)
    ]
    ep = [span([r(d, p, t) for d in range(lay.dp) for t in range(lay.tp)]) for p in range(lay.pp)] if lay.ep else []
    dp = [span([r(d, p, t) for d in range(lay.dp)]) for p in range(lay.pp) for t in range(lay.tp)] if lay.dp > 1 else []
    out = {}
    for name, spans in (("tp", tp), ("pp", pp), ("ep", ep), ("dp", dp)):
        if spans:
            out[name] = {"groups": len(spans), "crossing": sum(s > 1 for s in spans), "max_nodes": max(spans)}
    return out


def annotate(doc: dict, lay: Layout, nnodes: int) -> dict:
    """plan.json gains `nodes` {nnodes, ranks_per_node, groups} and each collective `crosses_nodes`."""
    g = groups(lay, nnodes)
    for c in doc.get("collectives") or []:
        info = g.get(c.get("group"))
        c["crosses_nodes"] = bool(info and info["crossing"])
    doc["nodes"] = {"nnodes": nnodes, "ranks_per_node": lay.world_size // nnodes, "groups": g}
    return doc


def format_nodes(doc: dict) -> list[str]:
    n = doc.get("nodes")
    if not n:
        return []
    out = [f"across {n['nnodes']} node(s), {n['ranks_per_node']} ranks per node (vLLM's --nnodes, consecutive ranks):"]
    for name, g in n["groups"].items():
        where = (
            f"{g['crossing']} of {g['groups']} group(s) cross nodes (up to {g['max_nodes']} nodes)"
            if g["crossing"]
            else f"all {g['groups']} group(s) within one node"
        )
        out.append(f"  {name}: {where}")
    crossing = [c for c in doc.get("collectives") or [] if c.get("crosses_nodes")]
    if crossing:
        b = min(c["batch"] for c in crossing)
        per = sum(c["count"] for c in crossing if c["batch"] == b)
        out.append(f"  {per} collective call(s) per decode step (batch {b}) cross the inter-node network")
    return out
