"""A check's outcome and the pure functions that judge a figure. Every judge takes
the measured figure and what it is held against, so a test can hand it a wrong
figure and see FAIL.

Units: *_us microseconds, *_ms milliseconds; ratios are measured / reference.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"


@dataclass
class Check:
    id: str
    status: str
    figure: str  # the number(s) behind the verdict, with units and conditions
    detail: dict = field(default_factory=dict)

    def line(self) -> str:
        return f"{self.status:<4}  {self.id:<22} {self.figure}"

    def to_dict(self) -> dict:
        return asdict(self)


def skip(id: str, why: str) -> Check:
    return Check(id, SKIP, why)


def judge_ratio(measured: float, reference: float, tol: float) -> str:
    """PASS when measured is within `tol` (relative) of reference."""
    if reference <= 0 or measured <= 0:
        return FAIL
    return PASS if abs(measured / reference - 1.0) <= tol else FAIL


def judge_sampled_steps(row_steps: list[int], steps_run: int, sample_every: int, per_step: int) -> str:
    """PASS when rows exist at exactly the sampled steps (step % sample_every == 0), `per_step` at each."""
    want = [s for s in range(steps_run) if s % sample_every == 0]
    got = sorted(row_steps)
    return PASS if got == sorted(want * per_step) else FAIL


def judge_at_most(value: float, limit: float) -> str:
    return PASS if value <= limit else FAIL


def judge_wrong(wrong: int) -> str:
    """nccl-tests' rule: any wrong element fails."""
    return PASS if wrong == 0 else FAIL


def exit_code(checks: list[Check]) -> int:
    return 1 if any(c.status == FAIL for c in checks) else 0


def summary(checks: list[Check]) -> str:
    n = {s: sum(c.status == s for c in checks) for s in (PASS, FAIL, SKIP)}
    return f"# {n[PASS]} PASS, {n[FAIL]} FAIL, {n[SKIP]} SKIP (exit {exit_code(checks)})"


def sabotaged(check_id: str) -> float:
    """Test-only: with TPCOMM_SELFCHECK_TEST_FAULTS=1, TPCOMM_SELFCHECK_TEST_FAULT=<id> makes that check's
    known-length work run 3x longer than the length it is judged against, so the check must FAIL.
    Returns the factor (1.0 when not asked, or without the test flag)."""
    import os

    if os.environ.get("TPCOMM_SELFCHECK_TEST_FAULTS") != "1":
        return 1.0
    return 3.0 if os.environ.get("TPCOMM_SELFCHECK_TEST_FAULT") == check_id else 1.0
