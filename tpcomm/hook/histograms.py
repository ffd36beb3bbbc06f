"""Per-op duration histograms kept on each worker, so a metrics scrape costs the same whatever the buffer holds.

A scrape used to pull the whole record buffer from every worker (1.1-1.8 s
with a full buffer) and doubled TPOT under a Prometheus-style scrape loop.
Now each worker folds its records into fixed histograms incrementally: a
scrape folds only the rows added since the previous one (numpy, no Python
loop per row) and returns a few hundred numbers. Nothing is added to the
collective's own path.

Labels are bounded: (group, op, size bucket, backend) for collectives, step
kind for steps; a size bucket is a power-of-4 upper bound on bytes per call.

Units: microseconds for durations, bytes for sizes.
"""

from __future__ import annotations

import numpy as np

BUCKETS_US = (5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 100_000)
SIZE_BUCKETS = (1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)
_EDGES = np.asarray(BUCKETS_US, dtype=np.float64)
_SIZES = np.asarray(SIZE_BUCKETS, dtype=np.int64)


def size_label(i: int) -> str:
    if i >= len(SIZE_BUCKETS):
        return f">{_human(SIZE_BUCKETS[-1])}"
    return f"<={_human(SIZE_BUCKETS[i])}"


def _human(n: int) -> str:
    return f"{n >> 20}MiB" if n >= 1 << 20 else f"{n >> 10}KiB"


class Histograms:
    """Cumulative per-key histograms over rows [0, folded) of a Recorder's columns."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.folded = 0
        self.folded_steps = 0
        # key -> [bucket counts (len(BUCKETS_US) + 1, the last is +Inf only), sum_us, count]
        self.coll: dict[tuple[int, int, int, int], list] = {}
        self.steps: dict[int, list] = {}

    def fold(self, rec, upto: int | None = None, last_step_open: bool = True) -> None:
        """Add rows [folded, upto) of the collective table (rows from `upto` on may still get their end time:
        CUDA events not read yet) and the new step rows (the last one too when `last_step_open` is False:
        sample_tokens extends the latest step's end)."""
        n = rec.n if upto is None else min(upto, rec.n)
        if n > self.folded:
            c, lo = rec._c, self.folded
            dur = (c["t_end_ns"][lo:n] - c["t_start_ns"][lo:n]) / 1e3
            sizes = np.searchsorted(_SIZES, c["bytes"][lo:n], side="left")
            keys = np.stack(
                [
                    c["group_idx"][lo:n].astype(np.int64),
                    c["op"][lo:n].astype(np.int64),
                    sizes,
                    c["backend"][lo:n].astype(np.int64),
                ],
                axis=1,
            )
            _add(self.coll, keys, dur, tuple)
            self.folded = n
        m = rec.n_steps
        if m > self.folded_steps:
            s, lo = rec._s, self.folded_steps
            m = m - 1 if last_step_open else m
            if m > lo:
                dur = (s["t_end_ns"][lo:m] - s["t_start_ns"][lo:m]) / 1e3
                _add(self.steps, s["kind"][lo:m].astype(np.int64)[:, None], dur, lambda k: int(k[0]))
                self.folded_steps = m

    def export(self, rec) -> dict:
        """Plain data for collective_rpc: labels decoded, counts cumulative per bucket (Prometheus `le`)."""
        groups = rec.groups or [("unknown", "", -1, 0)]
        names = lambda v, i: v.names[i] if i < len(v.names) else "unknown"  # noqa: E731
        coll = [
            {
                "group": groups[g][0] if g < len(groups) else "unknown",
                "op": names(rec.ops, o),
                "size": size_label(sz),
                "backend": names(rec.backends, b),
                "cumulative": np.cumsum(v[0]).tolist(),
                "sum_us": v[1],
                "count": v[2],
            }
            for (g, o, sz, b), v in sorted(self.coll.items())
        ]
        from tpcomm.hook.recorder import STEP_KINDS

        steps = [
            {
                "kind": STEP_KINDS[k] if k < len(STEP_KINDS) else "unknown",
                "cumulative": np.cumsum(v[0]).tolist(),
                "sum_us": v[1],
                "count": v[2],
            }
            for k, v in sorted(self.steps.items())
        ]
        return {"buckets_us": list(BUCKETS_US), "collectives": coll, "steps": steps}


def _add(table: dict, keys: np.ndarray, dur: np.ndarray, keyfn) -> None:
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    bucket = np.searchsorted(_EDGES, dur, side="left")  # le semantics: dur <= edge
    counts = np.zeros((len(uniq), len(BUCKETS_US) + 1), dtype=np.int64)
    np.add.at(counts, (inv, bucket), 1)
    sums = np.bincount(inv, weights=dur, minlength=len(uniq))
    for j, k in enumerate(uniq):
        key = keyfn(tuple(int(x) for x in k))
        cur = table.get(key)
        if cur is None:
            table[key] = [counts[j], float(sums[j]), int(counts[j].sum())]
        else:
            cur[0] = cur[0] + counts[j]
            cur[1] += float(sums[j])
            cur[2] += int(counts[j].sum())
