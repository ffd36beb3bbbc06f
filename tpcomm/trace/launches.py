"""Which step and which host ops a GPU kernel belongs to, in time linear in the events.

Launchers    kernel -> its launch (CUDA correlation id) -> the host ops open around it on that thread
gpu_ranges   vLLM's step ranges as the trace shows them on the GPU (gpu_user_annotation)
"""

from __future__ import annotations

import numpy as np

from tpcomm.trace import classify as K
from tpcomm.trace.reader import CAT_CODE, RUNTIME_CATS


class Launchers:
    """For a kernel: the host ops around its launch (CUDA correlation id -> the launch -> enclosing ops).

    One sweep per host thread over its wrapper ops and the launches of the kernels asked about, both sorted by
    time, with a stack of the ops open at the current time: time linear in the events (plus the sort), where
    asking each kernel against every wrapper grew with kernels x wrappers (issue 28: 92 of 104 s there on a
    216k-event A100 trace). A CUDA graph's kernels share the cudaGraphLaunch's correlation id: one launch."""

    def __init__(self, tr, host, names, name, ts, dur, tid, cat, kernels):
        corr = np.frombuffer(tr.corr, dtype=np.int64)
        rt = np.flatnonzero(np.isin(cat, list(RUNTIME_CATS)))
        self.launch = {int(corr[j]): (int(ts[j]), int(tid[j])) for j in rt}
        self.tr, self.names, self.name, self.ts, self.corr = tr, names, name, ts, corr
        w = [
            j for j in tr.args if host[j] and (K.is_wrapper(names[name[j]]) or K.LOOKS_LIKE_COMM.search(names[name[j]]))
        ]
        by_tid: dict[int, list] = {}
        for j in w:  # (time, 0 = an op opens, row); launches sort after ops that open at the same time
            by_tid.setdefault(int(tid[j]), []).append((int(ts[j]), 0, j))
        for i in kernels:
            hit = self.launch.get(int(corr[i]))
            if hit is not None:
                by_tid.setdefault(hit[1], []).append((hit[0], 1, i))
        self._enc: dict[int, list[int]] = {}
        for evs in by_tid.values():
            evs.sort()
            stack: list[int] = []
            for t, kind, j in evs:
                stack = [o for o in stack if ts[o] + dur[o] >= t]  # ops ended before t are closed for good
                if kind == 0:
                    stack.append(j)
                else:
                    self._enc[j] = stack[::-1]  # innermost first

    def _around(self, i) -> list[int]:
        return self._enc.get(i, [])

    def issued(self, i) -> int:
        """When the kernel was launched on the host (trace clock), else when it started on the device."""
        hit = self.launch.get(int(self.corr[i]))
        return hit[0] if hit else int(self.ts[i])

    def around(self, i) -> list[dict]:
        return [self.tr.args[j] for j in self._around(i)]

    def op_name(self, i) -> str | None:
        for j in self._around(i):
            nm = self.names[self.name[j]]
            if nm.startswith(("nccl:", "gloo:")):
                return K.op_of(nm.split(":", 1)[1], None)
        return None


def gpu_ranges(tr, cat, name, ts, dur, vllm_rows, step_re) -> tuple[np.ndarray, np.ndarray] | None:
    """vLLM's step ranges as the trace shows them on the GPU (`gpu_user_annotation`, the same names): (starts,
    ends) sorted, when they pair one to one, in order and by name, with the host ranges; else None."""
    g = np.flatnonzero(cat == CAT_CODE["gpu_user_annotation"])
    if not len(g) or not vllm_rows:
        return None
    steps_named = [i for i in np.unique(name[g]).tolist() if step_re.match(tr.names[i])]
    g = g[np.isin(name[g], steps_named)]
    g = g[np.argsort(ts[g], kind="stable")]
    if len(g) != len(vllm_rows) or (name[g] != name[np.array(vllm_rows)]).any():
        return None
    return ts[g], ts[g] + dur[g]
