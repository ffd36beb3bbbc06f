"""Human-readable plan tables."""

from __future__ import annotations

from tpcomm.table import human_bytes, render


def format_plan(doc: dict) -> str:
    m, lay = doc["model"], doc["layout"]
    head = (
        f"{m['name']} ({m['architecture']}, {m['attention'].upper()}"
        + (
            " ("
            + ", ".join(f"{n} {k}" for k, n in m["layer_kinds"].items())
            + " attention layers"
            + (f", window {m['sliding_window']}" if m.get("layer_kinds", {}).get("sliding") else "")
            + ")"
            if m.get("layer_kinds")
            else ""
        )
        + f", {m['num_layers']} layers: "
        f"{m['dense_layers']} dense + {m['moe_layers']} MoE), weights {m['quantization']['description']}\n"
        f"layout TP={lay['tp']} EP={'on (size ' + str(lay['ep_size']) + ')' if lay['ep'] else 'off'} DP={lay['dp']} "
        f"PP={lay['pp']} DCP={lay['dcp']} | collectives per decode step as issued by vLLM {doc['vllm_version_followed']} (derived from its model code)"
    )
    parts = [head]
    fu = doc.get("allreduce_fusion")
    if fu:
        state = {True: "on", False: "off", None: "unknown"}[fu["enabled"]]
        parts.append(f"all-reduce + RMSNorm fusion (SM {fu['sm']}, FlashInfer): {state}: {fu['why']}")
    for b in doc["batches"]:
        rows = [
            [
                c["op"],
                c["group"] + f"({c['group_size']})",
                c["bytes"],
                human_bytes(c["bytes"]),
                c["count"],
                c["dtype"],
                "-" if c["pp_stage"] is None else c["pp_stage"],
                c["site"] + (" [fused AR+RMSNorm]" if c.get("fused") else ""),
            ]
            for c in doc["collectives"]
            if c["batch"] == b
        ]
        parts.append(
            f"\nbatch {b}:\n"
            + render(["op", "group", "bytes", "size", "count", "dtype", "stage", "site"], rows, "llrrrlrl")
        )
        tot = doc["totals"][str(b)]
        parts.append(
            "totals per step: "
            + ", ".join(f"{op} x{t['count']} ({human_bytes(t['bytes'])} per rank)" for op, t in tot.items())
        )
        w = doc["weights"][str(b)]
        wrows = [
            [c["component"], c["sharding"], c["bits_per_weight"], human_bytes(c["bytes_per_gpu"])]
            for c in w["components"]
        ]
        parts.append(
            f"\nweights read per GPU per decode step at batch {b}: {human_bytes(w['bytes_per_gpu_per_step'])}\n"
            + render(["component", "sharding", "bits/weight", "bytes/GPU"], wrows, "llrr")
        )
    kv = doc["kv_cache"]
    parts.append(f"\nKV cache: {human_bytes(kv['bytes_per_token_per_gpu'])} per context token per GPU ({kv['layout']})")
    return "\n".join(parts)
