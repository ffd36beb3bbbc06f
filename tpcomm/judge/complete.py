"""The one rule for whether a level measured what it claims (issue 22): otherwise it is "incomplete".

A level's figures describe C closed-loop streams on a server that runs them as the hook recorded them. They
do not when:
- any of its requests failed (the figures cover fewer streams than asked, and whatever broke them);
- a TP worker stopped answering (stopped, hung or dead: `worker_problem`, named by attribute/ranks.py);
- another client took the hook (started or stopped the recording, or restarted it during the records pull:
  `hook_problem`), or its records could not be fetched (`records_problem`);
- the batch held other traffic: decode steps carried more sequences than the C streams of the level. A
  closed loop of C never has more than C in flight, so one decode step of the window with more than C held a
  sequence that was not ours (`seqs_counts`: the window's decode steps by their sequence count). The mean
  alone (`seqs_per_step`: the larger of the split's and the whole window's) misses it where the level's own
  steps carry fewer than C as often: at C=2 beside another client's C=1, 184 steps of 3 and 195 of 1 (its
  own streams out of step) averaged 1.98 (2026-12-07); it is the rule where no counts were kept;
- it was interrupted (Ctrl-C).

An incomplete level keeps its measured figures, but no headline comes from it, and `attribute` ends
"incomplete" (exit 1). attribute (when it writes the summary), --reanalyse and report use this module only.
"""

from __future__ import annotations

from tpcomm.rundir.documents import LoadLevel

# A mean of integers that exceeds C by float noise alone is not other traffic.
SEQS_EPS = 1e-6


def level_incomplete(
    level: LoadLevel, seqs_per_step: float | None, seqs_counts: dict[int, int] | None = None
) -> str | None:
    """Why the level (an entry of load/levels.json) is incomplete, or None when it is not. `seqs_counts`: the
    window's decode steps by how many sequences each carried (None: not kept, the mean alone judges)."""
    c = level.concurrency
    why = []
    if level.interrupted:
        why.append(level.interrupted)
    if level.worker_problem:
        why.append(level.worker_problem)
    if level.hook_problem:
        why.append(level.hook_problem)
    elif level.records_problem:
        why.append(level.records_problem)
    if level.failed:
        why.append(f"{level.failed} of {level.requests} requests failed")
    above = {k: n for k, n in (seqs_counts or {}).items() if k > c}
    if above:
        steps = sum((seqs_counts or {}).values())
        mean = f"; {seqs_per_step:.2f} sequences per decode step on average" if seqs_per_step is not None else ""
        why.append(
            f"the batch held other traffic: {sum(above.values())} of {steps} decode steps carried more sequences "
            f"than this level's {c} stream{'' if c == 1 else 's'} (up to {max(above)}{mean})"
        )
    elif seqs_per_step is not None and seqs_per_step > c + SEQS_EPS:
        why.append(
            f"the batch held other traffic: {seqs_per_step:.2f} sequences per decode step on average where this "
            f"level runs {c} stream{'' if c == 1 else 's'}"
        )
    return "; ".join(why) or None
