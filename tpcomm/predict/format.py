"""Human-readable predict output."""

from __future__ import annotations

from tpcomm.table import render


def format_predict(doc: dict) -> str:
    hw, lay, ss, ce = doc["hardware"], doc["layout"], doc["single_stream"], doc["ceilings"]
    link = hw["link"]
    lines = [
        f"MODEL-BASED PREDICTION (not a measurement): {doc['model']['name']} ({doc['model']['quantization']})",
        f"on {lay['world_size']}x {hw['name']} ({hw['memory_bandwidth_GBps']} GB/s, link {link['type']}"
        f"{' P2P' if link.get('p2p') else ' no-P2P'} {link.get('nvlink_GBps') or link['p2p_GBps']} GB/s), TP={lay['tp']} PP={lay['pp']}"
        f"{' EP' if lay['ep'] else ''}, decode, context {doc['conditions']['context_tokens']}",
        f"collective latency: {doc['collective_latency_source']}",
        "",
        f"single stream: {ss['tok_per_s']:.1f} tok/s ({ss['ms_per_token']:.2f} ms/token, {ss['bound']}-bound)",
    ]
    bd = ss["breakdown_ms"]
    lines.append(render(["term", "ms/token", "share"], [[k, f"{v:.2f}", f"{100 * v / ss['ms_per_token']:.0f}%"] for k, v in bd.items()], "lrr"))
    comm = ce["comm_only_tok_per_s"]
    lines += ["",
              f"interconnect: {ss['collectives_per_token']} collectives per token, {bd['collectives']:.2f} ms = "
              f"{100 * ce['interconnect_share_of_token']:.0f}% of each token",
              f"ceilings: comm-only {comm:.0f} tok/s (everything else free); compute-only {ce['compute_only_tok_per_s']:.1f} tok/s (collectives free)"
              if comm else f"ceilings: compute-only {ce['compute_only_tok_per_s']:.1f} tok/s (no collectives at this layout)"]
    if len(doc["batches"]) > 1:
        lines += ["", "batched decode (throughput):",
                  render(["batch", "step ms", "tok/s", "bound", "weights", "kv", "collectives", "overhead", "extra"],
                         [[b["batch"], f"{b['step_ms']:.2f}", f"{b['tok_per_s']:.1f}", b["bound"]]
                          + [f"{x:.2f}" for x in (b["breakdown_ms"]["weights"], b["breakdown_ms"]["kv_cache"], b["breakdown_ms"]["collectives"],
                                                  b["breakdown_ms"]["overhead"],
                                                  sum(v for k, v in b["breakdown_ms"].items() if k not in ("weights", "kv_cache", "collectives", "overhead")))]
                          for b in doc["batches"]], "rrrlrrrrr")]
    if doc.get("what_if"):
        lines += ["", "what if (single stream):",
                  render(["scenario", "tok/s", "change", "description"],
                         [[w["name"], "-" if w["tok_per_s"] is None else f"{w['tok_per_s']:.1f}", "-" if w["delta_pct"] is None else f"{w['delta_pct']:+.0f}%", w["description"]]
                          for w in doc["what_if"]], "lrrl")]
    if doc.get("compare"):
        lines += ["", "compare: " + doc["compare"]["conclusion"]]
    lines += ["", "assumptions:"] + [f"  - {a}" for a in doc["assumptions"]]
    return "\n".join(lines)
