"""The hook's per-step cost of noting attribute's own requests (issue 31, delivery above C=1), in-process.

Hook.step_begin + step_end on scheduler outputs shaped as vLLM 0.32's (the fields the hook reads), recording,
with a session that carries a request token (`attribute-<run id>-c8-r0`: the requests are looked up, and
attribute's own are noted) against one that does not (nothing looked up), side by side in one run, at batch
sizes 1-256, for attribute's own requests and for other clients'. Prints the microseconds per step of each
and the difference.

    .venv/bin/python benchmarks/bench_step_requests.py
"""

from __future__ import annotations

import time

from tpcomm.hook.core import Hook

RUN = "1a2b3c4d"


class _Sched:
    def __init__(self, per_req: dict[str, int]) -> None:
        self.num_scheduled_tokens = per_req
        self.total_num_scheduled_tokens = sum(per_req.values())
        self.scheduled_spec_decode_tokens = {}
        self.scheduled_new_reqs = []
        self.finished_req_ids = set()


def per_step_us(session: str, ids: list[str], steps: int = 3000) -> float:
    h = Hook()
    h.start(session=session)
    s = _Sched(dict.fromkeys(ids, 1))
    h.step_begin(s)
    h.step_end(object())
    t = time.perf_counter_ns()
    for _ in range(steps):
        h.step_begin(s)
        h.step_end(object())
    return (time.perf_counter_ns() - t) / steps / 1e3


def main() -> None:
    for whose, make in (
        ("attribute's own", lambda i: f"cmpl-tpcomm-{RUN}-{i}-0-9f3c2a1b"),
        ("other clients'", lambda i: f"cmpl-{i:032x}-0-9f3c2a1b"),
    ):
        for batch in (1, 8, 64, 256):
            ids = [make(i) for i in range(batch)]
            off = per_step_us("plain-session", ids)
            on = per_step_us(f"attribute-{RUN}-c8-r0", ids)
            print(
                f"{whose:16s} batch {batch:3d}: {off:6.1f} us per step without a request token, {on:6.1f} with "
                f"(+{on - off:.1f} us)"
            )


if __name__ == "__main__":
    main()
